"""Knowledge distillation: the KD loss, the teacher and the student built from it (distill), and
the teacher-logit cache computed once per key and dealt out across ranks (teacher_cache).

May import: the layers below it (errors ... tasks, config, runtime, parts, measure, data) and models.

Inside, lowest first: teacher_cache | distill
"""
