"""The simulator: calibration judged in virtual time, where its decisions are deterministic.

A client of the product, never a mode of it: it hands the torch engine a clock of its own and
replays a model's recorded greedy outputs behind the engine's own decode loop, so every figure it
makes is simulated. Nothing in batchspec outside this package imports it or names a regime
(tests/sim/test_apart.py); the simulation bench and the tests use it (docs/simulator.md, "Regimes").

    regimes   what a prefill, a decode step, an arm switch and a profile point cost on one kind of machine
    clock     a regime's prices, handed to the torch engine as its clock
    replay    recordings of plain greedy outputs, and the engine that replays them on a regime
"""
