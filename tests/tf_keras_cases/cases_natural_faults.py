"""The skip record on natural faults in real tf_keras `fit` runs.

Runs under TF_USE_LEGACY_KERAS=1 (see tests/_tf_keras_cases.py). The tests
are written once, in tests/_both_natural_faults.py (with the models of
`_natural_faults.py`), and run here on tf_keras (imported below; the
`flavour` fixture is tf_keras' in this process) and in
`test_skip_record_natural.py` on Keras 3. Every natural-fault test tf_keras
has holds on Keras 3 too: none is tf_keras' alone.
"""

from __future__ import annotations

from _both_natural_faults import *  # noqa: F403 (the tests on both Kerases)
