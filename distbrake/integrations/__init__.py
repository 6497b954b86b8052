"""Framework integrations of distbrake, one optional module per framework.

Each module imports its framework on import and needs the matching extra
(`pip install "distbrake[langchain]"`, `"distbrake[pydantic-ai]"`, ...);
this package itself imports no framework. What every adapter does alike
(the import guard, options, sessions, the check, refusal, warning and
observation) is written once in `kernel.py`; each framework module keeps
only its seam.
"""
