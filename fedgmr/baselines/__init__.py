"""Model-heterogeneous baselines (HeteroFL, FedRolex, FjORD, FIARSE) on FedGMR's core.

* :mod:`~fedgmr.baselines.structure` - width-``r`` sub-models as index lists / masks;
* :mod:`~fedgmr.baselines.policies` - their sub-model policies (registered in ``POLICIES``);
* :mod:`~fedgmr.baselines.fiarse_math` - FIARSE thresholds and gradient multiplier;
* :mod:`~fedgmr.baselines.training` - client trainers (plugged into ``ClientWorkload``);
* :mod:`~fedgmr.baselines.server` - label split, static BN pass, structured payload sizes;
* :mod:`~fedgmr.baselines.wire` - header-only encoding of structured slices;
* :mod:`~fedgmr.baselines.hooks` - the wiring used by ``build_experiment``.

Methods (``fedgmr.methods``): ``heterofl``, ``fedrolex``, ``fjord``, ``fiarse``, each also
``<name>_aux`` and ``<name>_aux_gmr``. Docs: ``docs/methods/<name>.md``.
"""
