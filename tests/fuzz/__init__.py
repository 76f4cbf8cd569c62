"""Seeded argument fuzzers for every public function of cynorm, cynorm.nested,
cynorm.distributed and cudnn_bind's host-side API.

* `arrays`  - argument material: dtypes, shapes, values (extremes included)
  and memory layouts, and the deliberately wrong variants;
* `oracles` - extended-precision (np.longdouble) references of every op with
  first-order forward error bounds, and the comparison against them;
* `cases`   - one small generator per target, and the TARGETS table;
* `runner`  - the driver: cases run in restartable worker processes with a
  timeout, each outcome classified; the command line, replays included:

      python -m tests.fuzz.runner --seed 1 --budget-seconds 60
      python -m tests.fuzz.runner --replay cynorm.layer_norm:1:17

A case is identified by (target, seed, index) and can be replayed alone.
"""
