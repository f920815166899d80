"""Prints the installed vLLM's requirements (its metadata's, without
extras), one per line, with the certifi pin that cannot resolve from PyPI
(`certifi>=2026.10.19`) relaxed to any certifi."""

from importlib.metadata import requires

for requirement in requires("vllm") or []:
    if "extra ==" in requirement:
        continue
    print("certifi" if requirement.startswith("certifi") else requirement)
