import sys

from pipeline.runtime import gc_pause

gc_pause.pause_for_setup(sys.argv[1:])  # before the imports: see pipeline/runtime/gc_pause.py

from pipeline.cli import main  # noqa: E402

code = main()
gc_pause.skip_final_collection()
raise SystemExit(code)
