"""The data path: a task's examples and features prepared once per node as memory-mapped Arrow
(features, prepared), a fraction of the training split held out as the dev split where asked
(holdout), a stage's splits assembled from them, rows then features, one way for the stage, a
finished stage's check and the benchmarks (splits), then sampled, batched and collated into the
loaders (loaders).

May import: errors, names, fsutil, layout, tasks, config, runtime, parts, measure.

Inside, lowest first: prepared | features | holdout loaders | splits
"""
