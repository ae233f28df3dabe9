"""best/README.md says what the model is, in the Hugging Face layout: front matter a hub reads
(pipeline tag, base model, datasets), then the task, model and teacher, data, precision, launch,
seed and the scores, from the job's record in output_dir (job.json, as a job writes it)."""
import yaml

from helpers import settled_config
from pipeline.config import load_config
from pipeline.config.schema import to_record
from pipeline.fsutil import write_json
from pipeline.job_record import JobRecord
from pipeline.layout import OutputDir
from pipeline.tasks import get_task
from pipeline.tracking.model_card import card_text


def write_record(out: OutputDir, overrides: list[str], **record) -> None:
    """out/job.json as a one-process job on the CPU writes it: its config settled, then `record`."""
    cfg = load_config(None, [f"output_dir={out.root}", *overrides])
    settled = settled_config(cfg, cfg.model, get_task(cfg.task))
    write_json(out.job, JobRecord(config=to_record(settled), **record).to_json())


def test_a_distilled_students_card_names_its_teacher_data_launch_and_scores(tmp_path):
    out = OutputDir(tmp_path / "wikiqa-student3-bf16-kd-all-MiniLM-L6-v2")
    out.root.mkdir()
    data = {"train": {"file": "hub:microsoft/wiki_qa", "fingerprint": "hub:abc|123"},
            "dev": {"file": "x", "fingerprint": "sha256:ff"}}
    write_record(out, ["task=wikiqa", "model=from_teacher:3", "precision=bf16", "seed=7",
                       "data.train=hub:microsoft/wiki_qa", "data.dev=holdout:0.1",
                       "kd.teacher=sentence-transformers/all-MiniLM-L6-v2", "train.epochs=2", "train.lr=5e-5"],
                 global_batch="32 rows", world_size=2, backend="deepspeed", precision="bf16", data=data,
                 teacher="sha256:teacher")
    card = card_text(out, {"eval/main": 0.7, "test/main": 0.65, "test/map": 0.6512, "infer/params": 22713216.0,
                           "infer/latency_ms_p50/bf16/median": 3.14159})
    front, body = card.split("---\n")[1], card.split("---\n", 2)[2]
    assert yaml.safe_load(front) == {"library_name": "transformers",
                                     "tags": ["bangla-amp-pipeline", "wikiqa", "knowledge-distillation"],
                                     "pipeline_tag": "text-classification",
                                     "base_model": "sentence-transformers/all-MiniLM-L6-v2",
                                     "datasets": ["microsoft/wiki_qa"]}
    for line in ("| teacher (distilled from) | sentence-transformers/all-MiniLM-L6-v2 |",
                 "| data: train | hub:microsoft/wiki_qa (hub:abc\\|123) |", "| precision | bf16 |",
                 "| launch | deepspeed backend, 2 processes, global batch 32 rows |", "| seed | 7 |",
                 "| test/map | 0.6512 |", "| params | 22713216 |", "| latency_ms_p50/bf16/median | 3.142 |"):
        assert line in body, line


def test_a_card_before_the_job_record_exists_still_says_what_it_can(tmp_path):
    card = card_text(OutputDir(tmp_path), {})
    assert card.startswith("---\nlibrary_name: transformers\n") and "Not evaluated yet." in card


def test_a_from_teacher_students_card_names_its_teachers_layers_and_what_it_trained(tmp_path):
    """The record holds the model that ran (from_teacher:1, not the task's default preset); the card
    says which of the teacher's layers the student started from, and the steps and epochs it
    trained (stopped by train.max_steps after one epoch: not the 3 planned)."""
    teacher = OutputDir(tmp_path / "teacher")
    (teacher.root / "best").mkdir(parents=True)
    write_json(teacher.root / "best" / "config.json", {"num_hidden_layers": 2})
    out = OutputDir(tmp_path / "student")
    out.root.mkdir()
    write_record(out, ["task=sentiment", "model=from_teacher:1", f"kd.teacher={teacher.root}", "train.epochs=3",
                       "train.max_steps=4", "train.lr=3e-4"],
                 global_batch="16 rows", world_size=1, backend="torch", precision="fp32", data={}, teacher="sha256:t")
    card = card_text(out, {"test/main": 0.5, "train/steps": 4, "train/epochs": 1})
    assert f"distilled by bangla-amp-pipeline from {teacher.root}: from_teacher:1" in card
    assert ("| student of the teacher | from_teacher:1: the teacher's embeddings, head and its layers 0 of 2, copied "
            "(init teacher-layers) |") in card
    assert "| trained | 4 optimizer steps in 1 epoch (stopped by train.max_steps=4) |" in card
    assert "base model" not in card and "bangla-small" not in card


def test_a_narrower_students_card_names_its_width_against_the_teachers_and_its_init(tmp_path):
    teacher = OutputDir(tmp_path / "teacher")
    (teacher.root / "best").mkdir(parents=True)
    write_json(teacher.root / "best" / "config.json", {"num_hidden_layers": 4, "hidden_size": 256,
                                                       "num_attention_heads": 4, "intermediate_size": 1024})
    out = OutputDir(tmp_path / "student")
    out.root.mkdir()
    widths = {"hidden_size": 128, "num_attention_heads": 2, "intermediate_size": 1024, "hidden_dropout_prob": 0.0}
    write_record(out, ["task=sentiment", "model=from_teacher:2", f"kd.teacher={teacher.root}",
                       *(f"model_config.{k}={v}" for k, v in widths.items())],
                 global_batch="16 rows", world_size=1, backend="torch", precision="fp32", data={}, teacher="sha256:t")
    card = card_text(out, {})
    assert ("| student of the teacher | from_teacher:2: the teacher's embeddings, head and its layers 0, 2 of 4, "
            "narrowed to hidden size 128 (the teacher's 256), attention heads 2 (the teacher's 4), each weight the "
            "teacher's evenly spaced slice, attention heads whole (init weight-selection) |") in card
