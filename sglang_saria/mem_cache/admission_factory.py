"""Admission policies by name (vLLM's policy factory, libCacheSim's ``create_admissioner``).

The one module that imports every policy module: importing one registers the factory of its
kinds (``policy_names.register``), so no policy module imports another to be found, and
``admission`` and ``budget`` do not import each other.
"""

from __future__ import annotations

from sglang_saria import policy_names
from sglang_saria.config import AdmissionConfig
from sglang_saria.mem_cache import auto, budget, learned  # noqa: F401  (register loadaware, budget:<DWPD>, auto)
from sglang_saria.mem_cache.admission import AdmissionPolicy  # registers the fixed and threshold kinds


def make_admission_policy(name: str, cfg: AdmissionConfig | None = None, ssd_capacity_bytes: int = 0) -> AdmissionPolicy:
    """Build a policy from its name through the kind registry (``policy_names``).

    ``budget:<DWPD>`` also reads ``cfg.budget_*`` and needs the drive capacity:
    ``cfg.budget_capacity_bytes``, else ``ssd_capacity_bytes`` (the SSD tier's).
    """
    pn = policy_names.parse(name)
    return policy_names.factory_for(pn.kind)(pn, cfg, ssd_capacity_bytes)
