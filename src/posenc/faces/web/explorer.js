// posenc report: the interactive explorers.
// Every number drawn here was computed by posenc and embedded in #posenc-data;
// this script only decodes, selects and draws (d3 v7, inlined before it).
(() => {
  "use strict";
  const source = document.getElementById("posenc-data");
  if (!source || typeof d3 === "undefined") return;
  const DATA = JSON.parse(source.textContent);
  const renders = [];

  // ---- shared helpers ------------------------------------------------------

  // {dtype, shape, b64[, deflate]} -> typed array (row-major) with .shape; decoded once.
  // Compressed arrays ("deflate": zlib) are inflated up front by `inflateAll`, with the
  // browser's own DecompressionStream.
  const decoded = new WeakMap();
  const inflated = new WeakMap();
  function base64Bytes(b64) {
    const text = atob(b64);
    const bytes = new Uint8Array(new ArrayBuffer(text.length));
    for (let i = 0; i < text.length; i++) bytes[i] = text.charCodeAt(i);
    return bytes;
  }
  function inflateAll(root) {
    const found = [];
    (function walk(o) {
      if (Array.isArray(o)) o.forEach(walk);
      else if (o && typeof o === "object") {
        if (typeof o.b64 === "string") {
          if (o.deflate) found.push(o);
        } else Object.values(o).forEach(walk);
      }
    })(root);
    return Promise.all(
      found.map((a) =>
        new Response(
          new Blob([base64Bytes(a.b64)]).stream().pipeThrough(new DecompressionStream("deflate")),
        )
          .arrayBuffer()
          .then((buffer) => inflated.set(a, new Uint8Array(buffer))),
      ),
    );
  }
  function decode(a) {
    if (decoded.has(a)) return decoded.get(a);
    const bytes = a.deflate ? inflated.get(a) : base64Bytes(a.b64);
    const out =
      a.dtype === "uint8"
        ? bytes
        : a.dtype === "float32"
          ? new Float32Array(bytes.buffer)
          : new Float64Array(bytes.buffer);
    out.shape = a.shape;
    decoded.set(a, out);
    return out;
  }
  const row = (a, i) => a.subarray(i * a.shape[1], (i + 1) * a.shape[1]);

  const SUP = "⁰¹²³⁴⁵⁶⁷⁸⁹";
  const sup = (k) => [...String(k)].map((c) => (c === "-" ? "⁻" : SUP[+c])).join("");
  const pow10 = (v) => {
    const k = Math.round(Math.log10(v));
    return k <= 3 ? String(10 ** k) : `10${sup(k)}`;
  };
  // a readable number: 4 significant digits, powers of ten when very large or small
  const num = (v) => {
    if (!Number.isFinite(v)) return "∞";
    const a = Math.abs(v);
    if (a >= 1e3 && a < 1e5) return minus(d3.format(",.0f")(v));
    if (a === 0 || (a >= 1e-3 && a < 1e3)) return minus(d3.format(".4~g")(v));
    const k = Math.floor(Math.log10(a));
    return `${minus(d3.format(".3~f")(v / 10 ** k))}×10${sup(k)}`;
  };
  const minus = (s) => String(s).replace(/^-/, "−");

  function title(root, text) {
    root.append("h3").attr("class", "explorer-title").text(text);
  }
  function controls(root) {
    return root.append("div").attr("class", "controls");
  }
  function control(bar, id, label) {
    const wrap = bar.append("div").attr("class", "control");
    wrap.append("label").attr("for", id).text(label);
    return wrap;
  }
  function select(bar, id, label, options, selected, onChange) {
    const s = control(bar, id, label).append("select").attr("id", id);
    s.selectAll("option")
      .data(options)
      .join("option")
      .attr("value", (_, i) => i)
      .text((d) => d);
    return s.property("value", selected).on("change", () => onChange(+s.property("value")));
  }
  // A slider over the integers 0 .. max; `shown(i)` is what its output prints for i.
  function range(bar, id, label, max, value, onInput, shown = (i) => i) {
    const wrap = control(bar, id, label);
    const input = wrap
      .append("input")
      .attr("type", "range")
      .attr("id", id)
      .attr("min", 0)
      .attr("max", max)
      .attr("step", 1)
      .property("value", value);
    const out = wrap.append("output").attr("id", `${id}-value`).attr("for", id).text(shown(value));
    input.on("input", () => onInput(+input.property("value")));
    return {
      set(v) {
        input.property("value", v);
        out.text(shown(v));
      },
    };
  }
  function figure(parent, cls, caption) {
    const fig = parent.append("figure").attr("class", cls);
    const body = fig.append("div").attr("class", "figure-body");
    fig.append("figcaption").html(caption);
    return body;
  }
  const widthOf = (sel, fallback = 900) => {
    const w = sel.node().getBoundingClientRect().width;
    return w > 50 ? Math.floor(w) : fallback;
  };

  // Integer ticks of a linear scale whose integer points are cell centres.
  const intTicks = (s, n) => s.ticks(Math.max(2, Math.round(n))).filter(Number.isInteger);

  function axes(g, w, h, bottom, left, xLabel, yLabel) {
    g.append("g").attr("class", "axis").attr("transform", `translate(0,${h})`).call(bottom);
    g.append("g").attr("class", "axis").call(left);
    g.append("text")
      .attr("class", "axis-label")
      .attr("x", w / 2)
      .attr("y", h + 34)
      .attr("text-anchor", "middle")
      .text(xLabel);
    g.append("text")
      .attr("class", "axis-label")
      .attr("transform", `translate(-40,${h / 2}) rotate(-90)`)
      .attr("text-anchor", "middle")
      .text(yLabel);
  }

  // A vertical colour bar: `colour(t)` for t in [0, 1] over `domain` [lo, hi], bottom to top.
  function colourBar(g, id, colour, domain, h, label) {
    const grad = g.append("defs").append("linearGradient").attr("id", id);
    grad.attr("x1", 0).attr("y1", 1).attr("x2", 0).attr("y2", 0);
    grad
      .selectAll("stop")
      .data(d3.range(0, 1.0001, 0.05))
      .join("stop")
      .attr("offset", (t) => t)
      .attr("stop-color", (t) => colour(t));
    g.append("rect")
      .attr("width", 12)
      .attr("height", h)
      .attr("fill", `url(#${id})`)
      .attr("stroke", "#999")
      .attr("stroke-width", 0.5);
    const s = d3.scaleLinear(domain, [h, 0]);
    g.append("g")
      .attr("class", "axis")
      .attr("transform", "translate(12,0)")
      .call(
        d3
          .axisRight(s)
          .tickValues([domain[0], (domain[0] + domain[1]) / 2, domain[1]])
          .tickFormat((v) => minus(d3.format(".3~f")(v))),
      );
    g.append("text")
      .attr("class", "axis-label")
      .attr("transform", `translate(62,${h / 2}) rotate(90)`)
      .attr("text-anchor", "middle")
      .text(label);
  }

  // A heatmap: cells on a crisp <canvas>, axes, colour bar and markers in the SVG on top.
  function heatmap(parent, opts) {
    const box = parent.append("div").attr("class", "heatmap");
    const canvas = box.append("canvas").attr("role", "img").attr("aria-label", opts.label);
    const svg = box.append("svg");
    return ({ rows, cols, colour, bar, width, height }) => {
      const m = { top: 8, right: 84, bottom: 42, left: 50 };
      const w = Math.max(60, width - m.left - m.right);
      const h = height;
      box.style("width", `${w + m.left + m.right}px`);
      svg.attr("width", w + m.left + m.right).attr("height", h + m.top + m.bottom);
      const dpr = window.devicePixelRatio || 1;
      canvas
        .style("left", `${m.left}px`)
        .style("top", `${m.top}px`)
        .style("width", `${w}px`)
        .style("height", `${h}px`)
        .attr("width", Math.round(w * dpr))
        .attr("height", Math.round(h * dpr));
      const cells = document.createElement("canvas");
      cells.width = cols;
      cells.height = rows;
      const image = new ImageData(cols, rows);
      for (let k = 0; k < rows * cols; k++) {
        const c = colour(k);
        image.data.set([c.r, c.g, c.b, 255], 4 * k);
      }
      cells.getContext("2d").putImageData(image, 0, 0);
      const ctx = canvas.node().getContext("2d");
      // nearest-neighbour when cells are at least a device pixel; averaging when they are smaller
      ctx.imageSmoothingEnabled = cols > w * dpr || rows > h * dpr;
      ctx.clearRect(0, 0, canvas.attr("width"), canvas.attr("height"));
      ctx.drawImage(cells, 0, 0, +canvas.attr("width"), +canvas.attr("height"));

      const x = d3.scaleLinear([-0.5, cols - 0.5], [0, w]);
      const y = d3.scaleLinear([-0.5, rows - 0.5], [0, h]);
      svg.selectAll("*").remove();
      const g = svg.append("g").attr("transform", `translate(${m.left},${m.top})`);
      const fmt = d3.format("d");
      axes(
        g,
        w,
        h,
        d3
          .axisBottom(x)
          .tickValues(intTicks(x, w / 55))
          .tickFormat(fmt),
        d3
          .axisLeft(y)
          .tickValues(intTicks(y, h / 28))
          .tickFormat(fmt),
        opts.x,
        opts.y,
      );
      const legend = svg.append("g").attr("transform", `translate(${m.left + w + 12},${m.top})`);
      colourBar(legend, opts.id, bar.colour, bar.domain, h, opts.bar);
      return { g: g.append("g").attr("class", "marks"), x, y, w, h };
    };
  }

  // A cell outline readable on any colour: dark halo under a light line.
  function outline(g, x0, y0, x1, y1) {
    for (const [stroke, width] of [
      ["#111", 3],
      ["#fff", 1.4],
    ]) {
      g.append("rect")
        .attr("x", x0)
        .attr("y", y0)
        .attr("width", x1 - x0)
        .attr("height", y1 - y0)
        .attr("fill", "none")
        .attr("stroke", stroke)
        .attr("stroke-width", width);
    }
  }

  // ---- 1. sinusoidal: table, first values, clock hands ---------------------

  function sinusoidal(root, S) {
    const TRAIL = 6;
    const state = {
      d: Math.max(0, S.dims.indexOf(S.dim)),
      b: Math.max(0, S.bases.indexOf(S.base)),
      p: Math.min(S.length - 1, Math.round((S.length - 1) / 4)),
    };
    const viridis = d3.range(256).map((v) => d3.rgb(d3.interpolateViridis(v / 255)));
    title(root, "Explore: the sinusoidal table and its clock hands");
    const bar = controls(root);
    select(bar, "dim", "d (channels)", S.dims, state.d, (v) => update({ d: v }));
    select(bar, "base", "base", S.bases.map(d3.format(",")), state.b, (v) => update({ b: v }));
    const pos = range(bar, "position", "position p", S.length - 1, state.p, (v) =>
      update({ p: v }),
    );

    const heatBody = figure(
      root,
      "pe-heatmap",
      `The whole table <code>posenc.sinusoidal(${S.length}, d, preset="${S.preset}", base=…)</code>: ` +
        "one row per position, one column per channel. The first channels change fast from row " +
        "to row, the last ones barely change. The outlined row is position p.",
    );
    const drawHeat = heatmap(heatBody, {
      id: "pe-heat-bar",
      x: "channel (depth)",
      y: "position",
      bar: "value",
      label: "heatmap of the encoding table",
    });
    const valuesBody = figure(
      root,
      "pe-first",
      "The first channels of the encoding at position p, as posenc computes them " +
        "(float64, rounded to 4 decimals here).",
    );
    const values = valuesBody.append("div").attr("id", "pe-values");
    const clockBody = figure(
      root,
      "pe-clocks",
      "Each (sin, cos) pair of channels is a clock hand at angle ω·p: each hand turns " +
        "counter-clockwise by ω radians per position, and needs λ = 2π/ω positions (its wavelength) " +
        `for a full turn. The faded arc and dots trace the previous ${TRAIL} positions. ` +
        "The hands are spread over the pairs, fast to slow.",
    );
    const clocks = clockBody.append("div").attr("id", "pe-clocks").attr("class", "clocks");

    function update(change) {
      Object.assign(state, change);
      pos.set(state.p);
      render();
    }

    function render() {
      const c = S.combos[`${state.d}|${state.b}`];
      const heat = decode(c.heat);
      const [rows, cols] = heat.shape;
      const width = widthOf(heatBody);
      const plot = drawHeat({
        rows,
        cols,
        width,
        height: Math.max(160, Math.min(300, rows * 6)),
        colour: (k) => viridis[heat[k]],
        bar: { colour: d3.interpolateViridis, domain: c.heat_range },
      });
      outline(plot.g, 0, plot.y(state.p - 0.5), plot.w, plot.y(state.p + 0.5));

      // the first values
      const first = decode(c.first);
      const vals = Array.from(row(first, state.p));
      values
        .selectAll("span.pe-label")
        .data([0])
        .join("span")
        .attr("class", "pe-label")
        .text(`PE(${state.p}, i)`);
      const cells = values
        .selectAll("span.pe-cell")
        .data(vals)
        .join((enter) => {
          const cell = enter.append("span").attr("class", "pe-cell");
          cell.append("span").attr("class", "pe-channel");
          cell.append("span").attr("class", "pe-value");
          return cell;
        });
      cells.select(".pe-channel").text((_, i) => c.labels[i]);
      cells.select(".pe-value").text((v) => v.toFixed(4));

      drawClocks(c, width);
    }

    function drawClocks(c, width) {
      const cos = decode(c.cos);
      const sin = decode(c.sin);
      const hands = c.pairs.length;
      const size = Math.max(84, Math.min(112, Math.floor((width - 8 * (hands - 1)) / hands)));
      const r = size / 2 - 8;
      const tip = (p, h) => [r * cos[p * hands + h], -r * sin[p * hands + h]]; // y up
      const svgs = clocks
        .selectAll("svg")
        .data(c.pairs)
        .join("svg")
        .attr("width", size)
        .attr("height", size + 42);
      svgs.each(function (pair, h) {
        const svg = d3.select(this);
        svg.selectAll("*").remove();
        const omega = c.omega[h];
        const [sinCh, cosCh] = c.channels[h];
        svg
          .append("title")
          .text(
            `pair ${pair} (channels ${sinCh}: sin, ${cosCh}: cos): ω = ${num(omega)} rad per ` +
              `position, wavelength λ = ${num(c.wavelength[h])} positions per turn`,
          );
        svg
          .append("text")
          .attr("class", "clock-title")
          .attr("x", size / 2)
          .attr("y", 12)
          .text(`pair ${pair}`);
        const g = svg.append("g").attr("transform", `translate(${size / 2},${size / 2 + 14})`);
        g.append("circle").attr("class", "dial").attr("r", r);
        g.append("path").attr("class", "cross").attr("d", `M${-r},0H${r}M0,${-r}V${r}`);
        const large = omega % (2 * Math.PI) > Math.PI ? 1 : 0;
        for (let k = TRAIL; k >= 1; k--) {
          const p = state.p - k;
          if (p < 0) continue;
          const fade = 0.75 * (1 - (k - 1) / TRAIL);
          const [x0, y0] = tip(p, h);
          const [x1, y1] = tip(p + 1, h);
          // sweep flag 0: counter-clockwise on screen (y points up here)
          g.append("path")
            .attr("class", "trail")
            .attr("d", `M${x0},${y0}A${r},${r} 0 ${large} 0 ${x1},${y1}`)
            .attr("stroke-opacity", fade);
          g.append("circle")
            .attr("class", "trail-dot")
            .attr("cx", x0)
            .attr("cy", y0)
            .attr("r", 2.2)
            .attr("fill-opacity", fade);
        }
        const [x, y] = tip(state.p, h);
        g.append("line").attr("class", "hand").attr("x2", x).attr("y2", y);
        g.append("circle").attr("class", "hand-tip").attr("cx", x).attr("cy", y).attr("r", 3.2);
        g.append("circle").attr("class", "hub").attr("r", 2);
        const t = svg
          .append("text")
          .attr("class", "clock-note")
          .attr("x", size / 2)
          .attr("y", size + 22);
        t.append("tspan").text(`λ = ${num(c.wavelength[h])}`);
        t.append("tspan")
          .attr("x", size / 2)
          .attr("dy", 13)
          .text(`ω = ${num(omega)}`);
      });
    }
    return render;
  }

  // ---- 2. RoPE: rotated q and k, the score matrix --------------------------

  function rope(root, R) {
    const P = R.positions;
    const state = { m: Math.min(P - 1, 12), n: Math.min(P - 1, 5), lock: false };
    const qRot = decode(R.q_rot);
    const kRot = decode(R.k_rot);
    const score = decode(R.score);
    const biggest = d3.max(score, Math.abs) || 1;
    const diverging = (t) => d3.interpolateRdBu(1 - t); // positive scores red
    const scoreColour = (v) => d3.rgb(diverging((v / biggest + 1) / 2));
    const reach =
      1.12 *
      d3.max(R.pairs, ([a, b]) => Math.max(Math.hypot(R.q[a], R.q[b]), Math.hypot(R.k[a], R.k[b])));

    title(root, "Explore: RoPE, where only the offset m − n matters");
    const bar = controls(root);
    const mIn = range(bar, "rope-m", "query position m", P - 1, state.m, (v) => move("m", v));
    const nIn = range(bar, "rope-n", "key position n", P - 1, state.n, (v) => move("n", v));
    const lock = control(bar, "rope-lock", "keep m − n fixed");
    lock.classed("check", true);
    lock
      .insert("input", "label")
      .attr("type", "checkbox")
      .attr("id", "rope-lock")
      .on("change", function () {
        state.lock = this.checked;
      });
    const readout = root.append("p").attr("class", "readout");
    readout.append("span").html("score q<sub>m</sub> · k<sub>n</sub> = ");
    const scoreOut = readout.append("output").attr("id", "rope-score");
    readout.append("span").text("   for offset m − n = ");
    const offsetOut = readout.append("output").attr("id", "rope-offset");
    readout
      .append("span")
      .attr("class", "muted")
      .text(`   (unrotated q · k = ${R.unrotated.toFixed(6)})`);

    const row2 = root.append("div").attr("class", "rope-row");
    const planeBody = figure(
      row2,
      "rope-planes",
      `RoPE rotates pair j of q by ω<sub>j</sub>·m and of k by ω<sub>j</sub>·n ` +
        `(head_dim ${R.head_dim}, base ${d3.format(",")(R.base)}: ${R.pairs.length} pairs). ` +
        `<span class="key q">q at m</span> and <span class="key k">k at n</span>; faint arrows: ` +
        "before rotation. A pair adds |q<sub>j</sub>||k<sub>j</sub>| cos(angle between the arrows) " +
        "to the score, and that angle changes with m − n only.",
    );
    const planes = planeBody.append("div").attr("id", "rope-planes").attr("class", "planes");
    const scoreBody = figure(
      row2,
      "rope-score-map",
      "Every score q<sub>m</sub> · k<sub>n</sub> (m down, n across): it is constant along each " +
        "diagonal, where m − n is fixed. The dashed line is the current diagonal, the outlined cell (m, n).",
    );
    const drawScore = heatmap(scoreBody, {
      id: "rope-score-bar",
      x: "key position n",
      y: "query position m",
      bar: "score qₘ · kₙ",
      label: "heatmap of the scores",
    });

    function move(which, v) {
      if (state.lock) {
        const off = state.m - state.n;
        // clamp so that both stay in range and the offset is kept
        const m = which === "m" ? v : v + off;
        state.m = Math.max(Math.max(0, off), Math.min(P - 1 + Math.min(0, off), m));
        state.n = state.m - off;
      } else state[which] = v;
      mIn.set(state.m);
      nIn.set(state.n);
      render();
    }

    function arrow(g, x, y, cls) {
      g.append("line")
        .attr("class", `arrow ${cls}`)
        .attr("x2", x)
        .attr("y2", y)
        .attr("marker-end", `url(#rope-head-${cls.replace(" ", "-")})`);
    }

    function render() {
      const { m, n } = state;
      scoreOut.text(score[m * P + n].toFixed(6));
      offsetOut.text(minus(m - n));
      const side = 150;
      const s = d3.scaleLinear([-reach, reach], [-side / 2 + 6, side / 2 - 6]);
      const qm = row(qRot, m);
      const kn = row(kRot, n);
      const svgs = planes
        .selectAll("svg")
        .data(R.pairs)
        .join("svg")
        .attr("width", side)
        .attr("height", side + 22);
      svgs.each(function ([a, b], j) {
        const svg = d3.select(this);
        svg.selectAll("*").remove();
        svg
          .append("title")
          .text(
            `pair ${j}: channels ${a} (x) and ${b} (y), ω = ${num(R.omega[j])} rad per position`,
          );
        if (j === 0) {
          const defs = svg.append("defs");
          for (const cls of ["q", "k", "q-faint", "k-faint"]) {
            defs
              .append("marker")
              .attr("id", `rope-head-${cls}`)
              .attr("viewBox", "0 0 10 10")
              .attr("refX", 8)
              .attr("refY", 5)
              .attr("markerWidth", 5)
              .attr("markerHeight", 5)
              .attr("orient", "auto")
              .append("path")
              .attr("class", `head ${cls.replace("-", " ")}`)
              .attr("d", "M0,0L10,5L0,10z");
          }
        }
        svg
          .append("text")
          .attr("class", "clock-title")
          .attr("x", side / 2)
          .attr("y", 13)
          .text(`pair ${j}: ω = ${num(R.omega[j])}`);
        const g = svg.append("g").attr("transform", `translate(${side / 2},${side / 2 + 20})`);
        g.append("path")
          .attr("class", "cross")
          .attr("d", `M${s(-reach)},0H${s(reach)}M0,${s(-reach)}V${s(reach)}`);
        for (const [v, cls] of [
          [R.q, "q"],
          [R.k, "k"],
        ]) {
          g.append("circle")
            .attr("class", `orbit ${cls}`)
            .attr("r", s(Math.hypot(v[a], v[b])) - s(0));
          arrow(g, s(v[a]), -s(v[b]), `${cls} faint`);
        }
        arrow(g, s(qm[a]), -s(qm[b]), "q");
        arrow(g, s(kn[a]), -s(kn[b]), "k");
      });

      const width = Math.min(widthOf(scoreBody, 420), 520);
      const plot = drawScore({
        rows: P,
        cols: P,
        width,
        height: width - 134,
        colour: (k) => scoreColour(score[k]),
        bar: { colour: diverging, domain: [-biggest, biggest] },
      });
      const off = m - n;
      const r0 = Math.max(0, off);
      const r1 = Math.min(P - 1, P - 1 + off);
      plot.g
        .append("line")
        .attr("class", "diagonal")
        .attr("x1", plot.x(r0 - off - 0.5))
        .attr("y1", plot.y(r0 - 0.5))
        .attr("x2", plot.x(r1 - off + 0.5))
        .attr("y2", plot.y(r1 + 0.5));
      // guides from the axes to the cell, so that (m, n) is easy to find
      plot.g
        .append("path")
        .attr("class", "guide")
        .attr("d", `M0,${plot.y(m)}H${plot.x(n - 0.5)}M${plot.x(n)},${plot.h}V${plot.y(m + 0.5)}`);
      outline(plot.g, plot.x(n - 0.5), plot.y(m - 0.5), plot.x(n + 0.5), plot.y(m + 0.5));
    }
    return render;
  }

  // ---- 3. context extension: wavelength per pair under each schedule -------

  function extension(root, E) {
    const state = { s: E.default.schedule, t: E.default.trained, f: E.default.factor };
    const half = E.head_dim / 2;
    const KIND = ["#4e79a7", "#f28e2b", "#59a14f"];
    const original = decode(E.original_wavelength);
    const kase = (s = state.s, t = state.t, f = state.f) => E.cases[`${s}|${t}|${f}`];
    // one y range for every case, so switching shows the points move
    const all = [...original];
    for (const c of Object.values(E.cases)) {
      for (const v of decode(c.wavelength)) if (Number.isFinite(v)) all.push(v);
      all.push(c.summary.target);
    }
    const yDomain = [
      10 ** Math.floor(Math.log10(d3.min(all))),
      10 ** Math.ceil(Math.log10(d3.max(all))),
    ];

    title(root, "Explore: stretching RoPE to a longer context");
    const bar = controls(root);
    select(
      bar,
      "ext-schedule",
      "schedule",
      E.schedules.map((s) => s.label),
      state.s,
      (v) => update({ s: v }),
    );
    select(bar, "ext-trained", "trained length", E.trained.map(String), state.t, (v) =>
      update({ t: v }),
    );
    const factorSel = select(bar, "ext-factor", "target length", E.factors, state.f, (v) =>
      update({ f: v }),
    );

    const body = figure(
      root,
      "ext-chart",
      `For ${E.name}, each dot is one frequency pair's wavelength (positions per turn) after ` +
        "the schedule; the grey line is before it. A pair whose original wavelength is longer " +
        "than the trained length never made a full turn in training: over the target length it " +
        "meets only angles it has seen if the schedule stretched its wavelength by at least " +
        "target ÷ trained. Red rings mark the pairs that go beyond.",
    );
    const svg = body
      .append("svg")
      .attr("id", "ext-svg")
      .attr("role", "img")
      .attr("aria-label", "wavelength per pair");
    const legend = body.append("div").attr("class", "legend");
    const swatch = (cls, draw, text) => {
      const item = legend.append("span").attr("class", "item");
      draw(item.append("svg").attr("width", 22).attr("height", 14).attr("class", cls));
      item.append("span").text(text);
    };
    swatch(
      "",
      (s) =>
        s
          .append("line")
          .attr("x1", 1)
          .attr("x2", 21)
          .attr("y1", 7)
          .attr("y2", 7)
          .attr("class", "original"),
      "original wavelength",
    );
    E.classes.forEach((name, i) =>
      swatch(
        "",
        (s) => s.append("circle").attr("cx", 11).attr("cy", 7).attr("r", 4.5).attr("fill", KIND[i]),
        {
          kept: "kept (frequency unchanged)",
          interpolated: "interpolated (divided by the factor)",
          blended: "blended (anything in between)",
        }[name] || name,
      ),
    );
    swatch(
      "",
      (s) => {
        s.append("circle").attr("cx", 11).attr("cy", 7).attr("r", 4.5).attr("class", "beyond");
        s.append("circle")
          .attr("cx", 11)
          .attr("cy", 7)
          .attr("r", 3)
          .attr("fill", "#fff")
          .attr("stroke", "#888");
      },
      "hollow with a red ring: over the target length, angles beyond those met in training",
    );
    const summary = root.append("div").attr("id", "ext-summary");

    function update(change) {
      Object.assign(state, change);
      render();
    }

    function render() {
      factorSel
        .selectAll("option")
        .text((f, i) => `${kase(state.s, state.t, i).summary.target} (×${f})`);
      const c = kase();
      const wl = decode(c.wavelength);
      const kind = decode(c.kind);
      const inRange = decode(c.in_range);
      const sum = c.summary;
      const trained = E.trained[state.t];

      const width = widthOf(body);
      const m = { top: 30, right: 16, bottom: 44, left: 58 };
      const w = width - m.left - m.right;
      const h = 330;
      svg.attr("width", width).attr("height", h + m.top + m.bottom);
      svg.selectAll("*").remove();
      const x = d3.scaleLinear([-1, half], [0, w]);
      const y = d3.scaleLog(yDomain, [h, 0]);
      svg
        .append("text")
        .attr("class", "chart-title")
        .attr("x", m.left)
        .attr("y", 16)
        .text(
          `${E.schedules[state.s].label}: trained on ${trained} positions, run at ${sum.target}`,
        );
      const g = svg.append("g").attr("transform", `translate(${m.left},${m.top})`);
      const decades = y.ticks().filter((v) => Math.abs(Math.log10(v) % 1) < 1e-9);
      g.append("g")
        .attr("class", "grid")
        .selectAll("line")
        .data(decades)
        .join("line")
        .attr("x2", w)
        .attr("y1", y)
        .attr("y2", y);
      axes(
        g,
        w,
        h,
        d3.axisBottom(x).tickValues(intTicks(x, w / 50).filter((v) => v >= 0 && v < half)),
        d3.axisLeft(y).tickValues(decades).tickFormat(pow10),
        "frequency pair j (fast → slow)",
        "wavelength (positions per turn)",
      );
      for (const [v, cls, text, dy] of [
        [trained, "trained", `trained length ${trained}`, 13],
        [sum.target, "target", `target length ${sum.target}`, -5],
      ]) {
        g.append("line")
          .attr("class", `level ${cls}`)
          .attr("x2", w)
          .attr("y1", y(v))
          .attr("y2", y(v));
        g.append("text")
          .attr("class", `level-label ${cls}`)
          .attr("x", 6)
          .attr("y", y(v) + dy)
          .text(text);
      }
      const pairs = d3.range(half);
      g.append("path")
        .attr("class", "original")
        .attr(
          "d",
          d3
            .line(
              (j) => x(j),
              (j) => y(original[j]),
            )
            .defined((j) => Number.isFinite(original[j]))(pairs),
        );
      const dots = g
        .append("g")
        .selectAll("g")
        .data(pairs.filter((j) => Number.isFinite(wl[j]) && wl[j] > 0))
        .join("g")
        .attr("transform", (j) => `translate(${x(j)},${y(wl[j])})`);
      dots
        .filter((j) => !inRange[j])
        .append("circle")
        .attr("class", "beyond")
        .attr("r", 5.5);
      dots
        .append("circle")
        .attr("r", 3.6)
        .attr("fill", (j) => (inRange[j] ? KIND[kind[j]] : "#fff"))
        .attr("stroke", (j) => KIND[kind[j]])
        .attr("stroke-width", (j) => (inRange[j] ? 0 : 1.6));
      dots
        .append("title")
        .text(
          (j) =>
            `pair ${j}: ${E.classes[kind[j]]}, wavelength ${num(original[j])} → ${num(wl[j])}` +
            (inRange[j] ? "" : " (beyond the angles met in training)"),
        );

      const items = [
        ["kept", sum.kept],
        ["interpolated", sum.interpolated],
        ["blended", sum.blended],
      ];
      summary.selectAll("*").remove();
      const p = summary.append("p");
      items.forEach(([key, v], i) => {
        p.append("span")
          .attr("class", "count")
          .attr("data-key", key)
          .style("color", KIND[i])
          .text(v);
        p.append("span").text(` ${key}${i < 2 ? " · " : ""}`);
      });
      p.append("span").text(" pairs;  ");
      p.append("span").attr("class", "count").attr("data-key", "in_range").text(sum.in_range);
      p.append("span").text(
        ` of ${half} pairs stay within the angles met in training;  attention scaling `,
      );
      p.append("span")
        .attr("class", "count")
        .attr("data-key", "attention_scaling")
        .text(sum.attention_scaling.toFixed(4));
      p.append("span").text(`;  longest wavelength ${num(sum.longest)} positions.`);
    }
    return render;
  }


  // ---- 4. diffusion timesteps: three conventions, similarity over t ----------

  function timestep(root, S) {
    const T = S.timesteps.count;
    const tAt = (i) => S.timesteps.first + i * S.timesteps.step;
    const state = {
      i: Math.round(T / 4),
      d: Math.max(0, S.dims.indexOf(S.dim)),
      p: 0,
    };
    const combo = (p, d) => {
      const c = S.combos[`${p}|${d}`];
      return c.same ? S.combos[c.same] : c;
    };
    const crossOf = (a, b) => {
      const c = S.cross[`${a}|${b}|${state.d}`];
      return c.same ? S.cross[c.same] : c;
    };
    const rdbu = (v) => d3.interpolateRdBu(1 - v / 255); // positive red, as the RoPE scores

    title(root, "Explore: one diffusion timestep through three conventions");
    const bar = controls(root);
    const tIn = range(bar, "ts-t", "timestep t", T - 1, state.i, (v) => update({ i: v }), (i) =>
      d3.format(".1f")(tAt(i)),
    );
    select(bar, "ts-dim", "d (channels)", S.dims, state.d, (v) => update({ d: v }));
    select(bar, "ts-preset", "similarity under", S.presets, state.p, (v) => update({ p: v }));

    const stripBody = figure(
      root,
      "ts-strips",
      "The embedding of t under each preset, one cell per channel (red +1, blue −1). The " +
        "same t gives different vectors: the halves are swapped ([sin | cos] or [cos | sin]) " +
        "and the frequencies differ slightly (h − 1 or h in the exponent). The line marks the " +
        "middle, where the second half starts.",
    );
    const strips = stripBody.append("svg").attr("id", "ts-strip-svg");
    const readout = root.append("div").attr("class", "readout");
    const first = readout.append("p");
    first.append("span").text("cos(e(t), e(t + 1)) = ");
    const nextOut = first.append("output").attr("id", "ts-next");
    first.append("span").attr("class", "muted").text("the same at every t, under the preset chosen");
    const second = readout.append("p");
    second.append("span").text("the same t under two presets: ");
    const crossOuts = [];
    for (let a = 0; a < S.presets.length; a++)
      for (let b = a + 1; b < S.presets.length; b++) {
        second.append("span").text(`cos(${S.presets[a]}, ${S.presets[b]}) = `);
        crossOuts.push([a, b, second.append("output").attr("id", `ts-cross-${a}-${b}`)]);
      }
    const lineBody = figure(
      root,
      "ts-lines",
      "Solid: the cosine similarity of e(t) with e(t′) for every timestep t′, under the " +
        "preset chosen above; it depends on t′ − t alone and falls off, with ripples, as " +
        "the timesteps move apart. Dashed: the cosine of two presets' embeddings of the same " +
        "t′ (a model trained with one and fed the other sees these).",
    );
    const lines = lineBody.append("svg").attr("id", "ts-line-svg");

    function update(change) {
      Object.assign(state, change);
      tIn.set(state.i);
      render();
    }

    function render() {
      const d = S.dims[state.d];
      const width = widthOf(stripBody);
      // strips
      const m = { top: 6, right: 16, bottom: 22, left: 150 };
      const rowH = 26;
      const w = width - m.left - m.right;
      strips.attr("width", width).attr("height", m.top + m.bottom + rowH * S.presets.length);
      strips.selectAll("*").remove();
      const x = d3.scaleLinear([0, d], [0, w]);
      const g = strips.append("g").attr("transform", `translate(${m.left},${m.top})`);
      S.presets.forEach((name, p) => {
        const levels = decode(combo(p, state.d).levels);
        const cells = d3.range(d).map((ch) => levels[ch * T + state.i]); // stored (d, T)
        const y = p * rowH;
        g.append("text")
          .attr("class", "axis-label")
          .attr("x", -8)
          .attr("y", y + rowH / 2 + 4)
          .attr("text-anchor", "end")
          .text(name)
          .append("title")
          .text(S.forms[p]);
        g.append("g")
          .selectAll("rect")
          .data(cells)
          .join("rect")
          .attr("x", (_, c) => x(c))
          .attr("y", y + 2)
          .attr("width", Math.max(0.5, x(1) - x(0)))
          .attr("height", rowH - 4)
          .attr("fill", (v) => rdbu(v));
      });
      g.append("line")
        .attr("class", "diagonal")
        .attr("x1", x(d / 2))
        .attr("x2", x(d / 2))
        .attr("y1", 0)
        .attr("y2", rowH * S.presets.length);
      g.append("g")
        .attr("class", "axis")
        .attr("transform", `translate(0,${rowH * S.presets.length})`)
        .call(d3.axisBottom(x).ticks(8).tickFormat(d3.format("d")));

      // readouts
      const c = combo(state.p, state.d);
      nextOut.text(c.next.toFixed(4));
      for (const [a, b, out] of crossOuts) {
        const v = decode(crossOf(a, b))[state.i];
        out.text(v.toFixed(4));
      }

      // lines
      const lm = { top: 10, right: 16, bottom: 42, left: 50 };
      const lw = width - lm.left - lm.right;
      const lh = 190;
      lines.attr("width", width).attr("height", lh + lm.top + lm.bottom);
      lines.selectAll("*").remove();
      const lg = lines.append("g").attr("transform", `translate(${lm.left},${lm.top})`);
      const tx = d3.scaleLinear([tAt(0), tAt(T - 1)], [0, lw]);
      const ty = d3.scaleLinear([-0.4, 1], [lh, 0]);
      axes(lg, lw, lh, d3.axisBottom(tx), d3.axisLeft(ty).ticks(5), "timestep t′", "cosine");
      const sim = decode(c.similarity); // offsets -(T-1) .. T-1 steps
      const idx = d3.range(T);
      lg.append("path")
        .attr("class", "ts-self")
        .attr(
          "d",
          d3.line(
            (j) => tx(tAt(j)),
            (j) => ty(sim[j - state.i + T - 1]),
          )(idx),
        );
      const other = crossOuts.find(([a, b]) => a === state.p || b === state.p) || crossOuts[0];
      if (other) {
        const cross = decode(crossOf(other[0], other[1]));
        lg.append("path")
          .attr("class", "ts-cross")
          .attr(
            "d",
            d3.line(
              (j) => tx(tAt(j)),
              (j) => ty(cross[j]),
            )(idx),
          );
        lg.append("text")
          .attr("class", "axis-label")
          .attr("x", lw - 4)
          .attr("y", ty(-0.3))
          .attr("text-anchor", "end")
          .text(`dashed: ${S.presets[other[0]]} against ${S.presets[other[1]]}`);
      }
      lg.append("line")
        .attr("class", "level target")
        .attr("x1", tx(tAt(state.i)))
        .attr("x2", tx(tAt(state.i)))
        .attr("y1", 0)
        .attr("y2", lh);
    }
    return render;
  }

  // ---- 5. ALiBi and T5: each head's bias over the keys, and its weights --------

  function bias(root, B) {
    const L = B.length;
    const state = { m: B.modules.length > 1 ? 1 : 0, h: 0, i: Math.min(L - 1, B.trained - 1) };
    title(root, "Explore: what a bias alone makes a query attend to");
    const bar = controls(root);
    select(
      bar,
      "bias-module",
      "bias",
      B.modules.map((m) => m.label),
      state.m,
      (v) => update({ m: v, h: Math.min(state.h, B.modules[v].heads - 1) }),
    );
    const headSel = select(
      bar,
      "bias-head",
      "head",
      d3.range(B.modules[state.m].heads).map((h) => h + 1),
      state.h,
      (v) => update({ h: v }),
    );
    const qIn = range(bar, "bias-query", "query position i", L - 1, state.i, (v) =>
      update({ i: v }),
    );
    const readout = root.append("p").attr("class", "readout");
    readout.append("span").text("weight on its own position: ");
    const selfOut = readout.append("output").attr("id", "bias-self");
    readout.append("span").text(" mean distance attended, Σ w·(i − j): ");
    const distOut = readout.append("output").attr("id", "bias-distance");
    const reach = readout.append("span").attr("class", "muted");
    const body = figure(
      root,
      "bias-chart",
      "Top: the bias the chosen head adds to the score of query i and each key j ≤ i (keys " +
        "after i are masked); the other heads faint. Bottom: the attention weights when every " +
        "content score q·k is the same, softmax of the bias alone. The shaded band is beyond " +
        `the lengths the lab trained on (${B.trained} positions). T5 shows its buckets as ` +
        "alternating bands: every key in one band gets the same learned number.",
    );
    const svg = body.append("svg").attr("id", "bias-svg");

    function update(change) {
      Object.assign(state, change);
      const heads = B.modules[state.m].heads;
      headSel
        .selectAll("option")
        .data(d3.range(heads).map((h) => h + 1))
        .join("option")
        .attr("value", (_, k) => k)
        .text((v) => v);
      headSel.property("value", state.h);
      qIn.set(state.i);
      render();
    }

    function render() {
      const M = B.modules[state.m];
      const biasAll = decode(M.bias);
      const weightsAll = decode(M.weights);
      const at = (a, h, i, j) => a[(h * L + i) * L + j];
      const { h, i } = state;
      selfOut.text(decode(M.self_weight)[h * L + i].toFixed(4));
      distOut.text(decode(M.mean_distance)[h * L + i].toFixed(2));
      reach.text(`(at most ${i})`);

      const width = widthOf(body);
      const m = { top: 12, right: 16, bottom: 42, left: 58 };
      const w = width - m.left - m.right;
      const h1 = 150;
      const h2 = 130;
      const gap = 26;
      svg.attr("width", width).attr("height", m.top + h1 + gap + h2 + m.bottom);
      svg.selectAll("*").remove();
      const g = svg.append("g").attr("transform", `translate(${m.left},${m.top})`);
      const x = d3.scaleLinear([-0.5, L - 0.5], [0, w]);
      const keys = d3.range(i + 1);
      let lo = 0;
      let hi = 0;
      for (let hh = 0; hh < M.heads; hh++)
        for (const j of keys) {
          lo = Math.min(lo, at(biasAll, hh, i, j));
          hi = Math.max(hi, at(biasAll, hh, i, j));
        }
      if (hi - lo < 1e-9) hi = lo + 1;
      const y1 = d3.scaleLinear([lo, hi], [h1, 0]).nice();
      // beyond the trained lengths, and T5's buckets
      for (const [gy, gh] of [
        [0, h1],
        [h1 + gap, h2],
      ]) {
        if (B.trained < L)
          g.append("rect")
            .attr("class", "untrained")
            .attr("x", x(B.trained - 0.5))
            .attr("y", gy)
            .attr("width", w - x(B.trained - 0.5))
            .attr("height", gh);
        g.append("rect")
          .attr("class", "masked")
          .attr("x", x(i + 0.5))
          .attr("y", gy)
          .attr("width", Math.max(0, w - x(i + 0.5)))
          .attr("height", gh);
      }
      if (M.buckets) {
        for (const j of keys) {
          if (M.buckets[i - j] % 2)
            g.append("rect")
              .attr("class", "bucket")
              .attr("x", x(j - 0.5))
              .attr("width", x(1) - x(0))
              .attr("y", 0)
              .attr("height", h1);
        }
      }
      g.append("g").attr("class", "axis").call(d3.axisLeft(y1).ticks(5));
      g.append("text")
        .attr("class", "axis-label")
        .attr("transform", `translate(-44,${h1 / 2}) rotate(-90)`)
        .attr("text-anchor", "middle")
        .text("bias");
      const line = (a, hh, y) =>
        d3.line(
          (j) => x(j),
          (j) => y(at(a, hh, i, j)),
        )(keys);
      for (let hh = 0; hh < M.heads; hh++)
        if (hh !== h) g.append("path").attr("class", "head-faint").attr("d", line(biasAll, hh, y1));
      g.append("path").attr("class", "head-line").attr("d", line(biasAll, h, y1));

      const g2 = g.append("g").attr("transform", `translate(0,${h1 + gap})`);
      let top = 0;
      for (const j of keys) top = Math.max(top, at(weightsAll, h, i, j));
      const y2 = d3.scaleLinear([0, top || 1], [h2, 0]).nice();
      axes(g2, w, h2, d3.axisBottom(x).ticks(10), d3.axisLeft(y2).ticks(4), "key position j", "weight");
      g2.append("g")
        .selectAll("rect")
        .data(keys)
        .join("rect")
        .attr("class", "weight-bar")
        .attr("x", (j) => x(j - 0.4))
        .attr("width", Math.max(0.5, x(0.8) - x(0)))
        .attr("y", (j) => y2(at(weightsAll, h, i, j)))
        .attr("height", (j) => h2 - y2(at(weightsAll, h, i, j)));
      g.append("line")
        .attr("class", "level target")
        .attr("x1", x(i))
        .attr("x2", x(i))
        .attr("y1", 0)
        .attr("y2", h1 + gap + h2);
    }
    return render;
  }

  // ---- wiring ----------------------------------------------------------------

  const parts = [
    ["sinusoidal-explorer", "sinusoidal", sinusoidal],
    ["timestep-explorer", "timestep", timestep],
    ["rope-explorer", "rope", rope],
    ["extension-explorer", "extension", extension],
    ["bias-explorer", "bias", bias],
  ];
  function buildAll() {
    for (const [id, key, build] of parts) {
      const node = document.getElementById(id);
      if (node && DATA[key]) {
        const root = d3.select(node);
        root.selectAll("*").remove();
        const render = build(root, DATA[key]);
        render();
        renders.push(render);
      }
    }
    document.documentElement.dataset.explorers = "ready";
  }
  inflateAll(DATA).then(buildAll, (error) => {
    console.error(`posenc explorers: cannot inflate the embedded data: ${error}`);
  });
  let pending = 0;
  let lastWidth = window.innerWidth;
  window.addEventListener("resize", () => {
    if (pending || window.innerWidth === lastWidth) return;
    pending = requestAnimationFrame(() => {
      pending = 0;
      lastWidth = window.innerWidth;
      renders.forEach((r) => r());
    });
  });
})();
