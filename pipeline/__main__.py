from pipeline.runtime import collector

collector.pause_for_setup()  # before the imports: see pipeline/runtime/collector.py

from pipeline.cli import main  # noqa: E402

code = main()
collector.skip_final_collection()
raise SystemExit(code)
