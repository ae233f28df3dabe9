"""Each task learns on its built-in sample set in fp32 and in bf16: one job per task and precision,
each task's own figures checked by its test file (LEARNS: the job; learned: what it must reach)."""
import pytest

from helpers import tracking_db
from integration import test_task_error_cls, test_task_ner, test_task_wikiqa
from pipeline.config import load_config
from pipeline.job.run import run

TASKS = {"error_cls": test_task_error_cls, "ner": test_task_ner, "wikiqa": test_task_wikiqa}


@pytest.mark.slow
@pytest.mark.parametrize("prec", ["fp32", "bf16"])
@pytest.mark.parametrize("task", TASKS)
def test_each_task_learns(tmp_path, task, prec):
    out, db = tmp_path / "out", tracking_db(tmp_path)
    figures = run(load_config(None, [*TASKS[task].LEARNS, f"precision={prec}", f"output_dir={out}",
                                     f"tracking.uri=sqlite:///{db}", "tracking.experiment=t"]))
    TASKS[task].learned(figures, out, db, prec)
