"""Reader scripts that run under another engine's own Python, one per engine.

Each script is run as a child process by :mod:`posenc.integration.analysis.engines`:
it reads one JSON request on stdin and prints one JSON answer on stdout. The scripts
import only the standard library and their engine, never posenc or numpy, since the
engine's environment has neither.
"""
