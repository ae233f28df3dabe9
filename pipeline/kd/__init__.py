"""Knowledge distillation: the loss terms (terms: KD, and the layer-wise hidden-state and
attention-relation terms over kd.layer_map), the table of them the distiller reads (registry: each
term's name, weight, what of the teacher it needs, how it is built), the teacher and the loss made of
the terms that are on (distill), the student built from the teacher, at its width or narrower, and its
size against the teacher's (student), and the teacher-logit cache computed once per key and dealt out
across ranks (teacher_cache).

May import: the layers below it (errors ... tasks, config, runtime, parts, measure, data) and models.

Inside, lowest first: student teacher_cache terms | registry | distill
"""
