"""What a run records beside its figures, as the MLflow UI shows it: the experiment is a model-
training experiment (MLflow 3 opens it on the runs, not the GenAI overview), params say what
actually ran beside what was asked (precision=auto resolved, world size, global batch), the data
of every split is a dataset input (source, digest, rows, split), and best/ is fp32."""
import json

import pytest

from helpers import FAST, tracking_db
from pipeline import names
from pipeline.config import load_config
from pipeline.runtime import precision

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    from mlflow.tracking import MlflowClient

    from pipeline.job import plan as settle
    from pipeline.job.run import run
    from pipeline.runtime import precision as policies

    tmp = tmp_path_factory.mktemp("record")
    uri = f"sqlite:///{tracking_db(tmp)}"
    counted = {"settle_config": 0, "resolve": 0}
    with pytest.MonkeyPatch.context() as mp:  # every resolution the job makes, counted
        for module, name in ((settle, "settle_config"), (policies, "resolve")):
            real = getattr(module, name)
            mp.setattr(module, name, lambda *a, _real=real, _name=name, **k: counted.__setitem__(
                _name, counted[_name] + 1) or _real(*a, **k))
        run(load_config(None, [*FAST, "precision=auto", "train.max_steps=3", "train.grad_accum=2",
                                     f"output_dir={tmp / 'out'}", f"tracking.uri={uri}", "tracking.experiment=rec"]))
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("rec")
    return {"out": tmp / "out", "experiment": experiment, "run": client.search_runs([experiment.experiment_id])[0],
            "resolutions": counted}


def test_the_job_is_settled_once(finished):
    """One plan per job: the config's derived defaults and the precision policy are decided once."""
    assert finished["resolutions"] == {"settle_config": 1, "resolve": 1}


def test_the_experiment_is_a_model_training_experiment(finished):
    assert finished["experiment"].tags["mlflow.experimentKind"] == "custom_model_development"


def test_params_say_what_ran_beside_what_was_asked(finished):
    params, tags = finished["run"].data.params, finished["run"].data.tags
    resolved = "bf16" if precision.cpu_supports_bf16() else "fp32"
    assert params["precision"] == "auto" and params["resolved.precision"] == resolved
    assert params["backend"] == "auto" and params["resolved.backend"] == "single"
    assert params["resolved.world_size"] == "1" and params["resolved.grad_accum"] == "2"
    assert params["resolved.global_batch"] == str(32 * 2)  # FAST's batch_size x accumulation x world
    assert tags[names.TAG_PRECISION_MODE] == ("autocast" if resolved == "bf16" else "fp32")


def test_every_split_is_a_dataset_input_with_its_rows(finished):
    from pipeline.tasks import get_task

    task = get_task("sentiment")
    inputs = {d.tags[0].value: d.dataset for d in finished["run"].inputs.dataset_inputs}
    assert set(inputs) == {"train", "dev", "test"}
    for split, dataset in inputs.items():
        assert json.loads(dataset.profile)["num_rows"] == len(task.load(None, split))
        assert dataset.source_type == "local" and json.loads(dataset.source)["uri"].endswith(f"{split}.tsv")
        assert len(dataset.digest) == 16
    assert len({d.digest for d in inputs.values()}) == 3  # different data, different digests


def test_best_model_is_saved_and_declared_fp32(finished):
    from safetensors.torch import load_file

    config = json.loads((finished["out"] / "best" / "config.json").read_text())
    assert config["dtype"] == "float32"
    assert {str(t.dtype) for t in load_file(finished["out"] / "best" / "model.safetensors").values()
            if t.is_floating_point()} == {"torch.float32"}
