"""kiln.tune: search each kernel's schedule decisions per machine, keep the best in a database.

The loop (Ansor / MetaSchedule, at kiln's scale):

- tasks.py     a model -> its distinct kernel workloads (kiln.lower.workload: a structural hash), weighted
               by how often each runs;
- space.py     THE SEAM with lowering: a task's decisions and their candidate values, and the
               kernel lowered with chosen values (kiln.lower.decisions);
- measure.py   candidates built in parallel, timed in a worker process (worker.py) with a timeout,
               their outputs checked against the default schedule's;
- features.py  a fixed-length vector per candidate, read from its lowered loop IR;
- costmodel.py gradient-boosted trees (xgboost, else lightgbm, else scikit-learn) on those features;
- search.py    evolutionary search ranked by the model: measure the top few plus random ones, retrain;
- records.py   the SQLite records database, keyed by workload and machine signature (signature.py);
- tuner.py     `kiln tune`: the time budget across tasks, progress, the final speedup table;
- apply.py     `kiln.compile(..., tuning=db)`: the best record per workload for this machine.

kiln.lower never imports kiln.tune: lowering takes decisions keyed by workload
(kiln.lower.workload); the compiler asks apply.py for them when a database is given.
"""
