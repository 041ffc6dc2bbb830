"""FedGMR on Flower: a ServerApp running the semi-asynchronous buffered loop over
Flower's message API and a ClientApp training masked sub-models.

``pip install 'fedgmr[flower]'``. Only :mod:`fedgmr.flower.adapter` imports Flower;
:mod:`~fedgmr.flower.payload`, :mod:`~fedgmr.flower.loop`, :mod:`~fedgmr.flower.client`
and :mod:`~fedgmr.flower.faults` do not. See ``docs/distributed.md``.
"""
