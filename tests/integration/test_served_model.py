"""tracking.log_model=true: best/ logged as an MLflow model of the transformers flavor, offline, linked
to its run and metrics, in the run's experiment; loaded back through MLflow it reproduces the run's
test predictions and can be registered."""
import json

import mlflow
import numpy as np
import pytest
from mlflow.entities import ViewType

from helpers import FAST, mlflow_runs, tracking_db
from pipeline import names
from pipeline.config import load_config
from pipeline.job.run import run
from pipeline.tasks import get_task

pytestmark = pytest.mark.slow

# the fluent API's experiment while the job runs: one the job must leave alone
FLUENT = "fluent-elsewhere"


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("served")
    out, db = tmp / "out", tracking_db(tmp, "mlflow.db")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("MLFLOW_EXPERIMENT_NAME", FLUENT)
        figures = run(load_config(None, [*FAST, "train.epochs=1", f"output_dir={out}",
                                         f"tracking.uri=sqlite:///{db}", "tracking.experiment=t",
                                         "tracking.log_model=true", "tracking.register_as=demo-student",
                                         "seed=3"]))
    (mlrun,) = mlflow_runs(db, "t")
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(f"sqlite:///{db}")
    yield {"out": out, "run": mlrun, "figures": figures}
    mlflow.set_tracking_uri(previous)


def test_the_logged_model_reproduces_the_runs_test_predictions(logged):
    (output,) = logged["run"].outputs.model_outputs  # an MLflow 3 logged model, an output of the run
    model = mlflow.MlflowClient().get_logged_model(output.model_id)
    assert model.source_run_id == logged["run"].info.run_id and model.name == "model"
    assert names.TEST_MAIN in {m.key for m in model.metrics}  # the run's final metrics, linked to it
    pipe = mlflow.transformers.load_model(f"models:/{output.model_id}")
    assert pipe.task == "text-classification"
    task = get_task("sentiment")
    examples = task.load(None, "test")  # normalized, as the run read them
    labels = [r["label"] for r in pipe([e["text"] for e in examples], batch_size=64)]
    predicted = np.eye(len(task.labels))[[task.labels.index(label) for label in labels]]
    # the whole split's score equals the run's: the same prediction on every row
    assert task.metrics({"logits": predicted}, examples, None)["macro_f1"] == logged["figures"][names.TEST_MAIN]
    served = mlflow.pyfunc.load_model(f"models:/{output.model_id}")  # what `mlflow models serve` runs
    assert list(served.predict([e["text"] for e in examples[:3]])["label"]) == labels[:3]


def test_the_logged_model_is_saved_offline_with_its_example_and_card(logged):
    saved = logged["out"] / "mlflow_model"
    example = json.loads((saved / "input_example.json").read_text())
    assert example and (saved / "model" / "model.safetensors").is_file()
    assert (saved / "components" / "tokenizer").is_dir()
    assert "transformers==" in (saved / "requirements.txt").read_text()
    card = (logged["out"] / "best" / "README.md").read_text()  # best/'s card, with the final figures
    assert card.startswith("---\nlibrary_name: transformers\n") and "pipeline_tag: text-classification" in card
    assert f"| test/main | {logged['figures'][names.TEST_MAIN]:.4f} |" in card and "| seed | 3 |" in card
    assert (saved / "model_card.md").read_text().strip() == card.split("---\n", 2)[2].strip()


def test_register_as_makes_a_version_that_loads_and_predicts_and_the_run_shows_its_source(logged):
    """tracking.register_as: version 1 of the registered model, described by the run's main test
    score, loads through the registry as `mlflow models serve` would; the run carries MLflow's own
    source tags (name, and the commit in a checkout)."""
    run = logged["run"]
    (version,) = mlflow.MlflowClient().search_model_versions("name='demo-student'")
    assert (str(version.version), version.run_id) == ("1", run.info.run_id)
    assert version.description == f"test macro_f1 {logged['figures'][names.TEST_MAIN]:.4f}"
    served = mlflow.pyfunc.load_model("models:/demo-student/1")
    assert set(served.predict(["ভালো লাগলো", "খুব খারাপ"])["label"]) <= set(get_task("sentiment").labels)
    tags = run.data.tags
    assert tags[names.TAG_SOURCE_NAME] == "python -m pipeline train" and tags[names.TAG_SOURCE_TYPE] == "LOCAL"
    assert len(tags[names.TAG_GIT_COMMIT]) == 40  # the tests run in a checkout


def long_document(tokens: int = 2000) -> str:
    """A comment far longer than any model's positions: `tokens` words of the sample set's own."""
    words = " ".join(e["text"] for e in get_task("sentiment").load(None, "train")[:400]).split()
    return " ".join(words[i % len(words)] for i in range(tokens))


def test_a_2000_token_document_is_served_by_best_and_the_registered_model(logged):
    """best/'s tokenizer carries the model's length and the served model truncates as training did:
    transformers.pipeline(truncation=True) and the registered model answer a long document."""
    import transformers

    best = str(logged["out"] / "best")
    assert transformers.AutoTokenizer.from_pretrained(best).model_max_length == 512
    doc = long_document()
    pipe = transformers.pipeline("text-classification", model=best, tokenizer=best, device="cpu")
    assert len(pipe.tokenizer(doc)["input_ids"]) > 1000  # longer than the model's 512 positions
    labels = set(get_task("sentiment").labels)
    assert pipe(doc, truncation=True)[0]["label"] in labels
    served = mlflow.pyfunc.load_model("models:/demo-student/1")  # as `mlflow models serve` runs it
    assert set(served.predict([doc, "ভালো লাগলো"])["label"]) <= labels


def models_by_experiment(client):
    """(experiment id, source run id) of every logged model in the store, whatever its experiment."""
    experiments = [e.experiment_id for e in client.search_experiments(view_type=ViewType.ALL)]
    return sorted((m.experiment_id, m.source_run_id) for m in client.search_logged_models(experiments))


def test_the_logged_model_is_in_its_runs_experiment_not_default(logged):
    """Where the experiment's Models page looks: MLflow's search of the run's experiment finds the
    model, none is in `Default` (id 0), and the fluent API's experiment was not used (nor created)."""
    run = logged["run"]
    (output,) = run.outputs.model_outputs
    (model,) = mlflow.search_logged_models(experiment_ids=[run.info.experiment_id], output_format="list")
    assert (model.model_id, model.source_run_id) == (output.model_id, run.info.run_id)
    assert mlflow.search_logged_models(experiment_ids=["0"], output_format="list") == []
    client = mlflow.MlflowClient()
    assert models_by_experiment(client) == [(run.info.experiment_id, run.info.run_id)]
    assert client.get_experiment_by_name(FLUENT) is None
    # its files with the experiment's, beside the store (not in `Default`'s folder under the working directory)
    assert model.artifact_location.startswith(client.get_experiment(run.info.experiment_id).artifact_location + "/")


def test_ui_prints_the_models_page_of_an_experiment_with_models_only(logged):
    from pipeline.tracking import open_experiment, ui

    uri = mlflow.get_tracking_uri()
    experiment_id = logged["run"].info.experiment_id
    assert ui.pages_for(uri, "t", None) == (ui.runs_page(experiment_id), ui.models_page(experiment_id))
    assert ui.models_page(experiment_id) == f"#/experiments/{experiment_id}/models?workflowType=machine_learning"
    _, empty = open_experiment(uri, "no-models")
    assert ui.pages_for(uri, "no-models", None) == (ui.runs_page(empty), None)


def test_a_replay_into_another_store_logs_the_model_in_the_runs_experiment(logged, tmp_path, monkeypatch):
    """`pipeline sync` to a store that never saw the run creates it, and its model beside it."""
    from pipeline.tracking import sync

    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", FLUENT)
    uri = f"sqlite:///{tracking_db(tmp_path, 'other.db')}"
    run_id = sync(str(logged["out"]), uri)
    client = mlflow.MlflowClient(uri)
    experiment_id = client.get_experiment_by_name("t").experiment_id
    assert models_by_experiment(client) == [(experiment_id, run_id)]


def test_a_sync_replay_logs_the_model_once(logged):
    from pipeline.tracking import sync

    run_id = logged["run"].info.run_id
    assert sync(str(logged["out"]), mlflow.get_tracking_uri()) == run_id
    assert len(mlflow.get_run(run_id).outputs.model_outputs) == 1


@pytest.mark.parametrize("task_name", ["wikiqa", "ner"])  # qa: no pipeline in transformers 5 (QaTask.serving_task)
def test_every_task_saves_as_a_pipeline_that_loads_and_answers_its_example(tmp_path, task_name):
    """Without a stage: a tiny model of the task's head, saved as best/ is, loads as the task's serving
    pipeline (pairs for WikiQA, words for NER)."""
    import torch
    from transformers import BertConfig

    from pipeline.models import preset_tokenizer
    from pipeline.tracking.served_model import save_served_model

    task = get_task(task_name)
    examples = task.load(None, "test")
    tokenizer = preset_tokenizer(task.texts(examples[:50]), vocab_size=300)
    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64, **task.model_kwargs())
    task.model_class.from_config(config).save_pretrained(tmp_path / "best")
    tokenizer.save_pretrained(tmp_path / "best")
    save_served_model(tmp_path / "best", task, examples, tmp_path / "mlflow_model")
    pipe = mlflow.transformers.load_model(str(tmp_path / "mlflow_model"))
    assert pipe.task == task.serving_task
    assert pipe(task.serving_inputs(examples[:2]))  # answers, in the pipeline's own format
