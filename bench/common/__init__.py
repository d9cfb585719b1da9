"""What the benches share, none of it a bench itself: the prompt sets (workloads, peer_prompts),
the side-by-side measuring helpers (measure), the per-step profile peer.py prints (step_profile)
and the one record of figures, bench/results.jsonl, with the table docs/performance.md shows
(results). The entry points are bench/engine.py, calibrate.py, pipeline.py, peer.py and scale.py.
"""
