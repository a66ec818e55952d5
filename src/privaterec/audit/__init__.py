"""End-to-end privacy audit of the real client updates (docs/privacy.md#checking-the-guarantees).

Mechanism-level audits (:mod:`privaterec.privacy.audit`) test a mechanism; this package
tests what a client actually sends: it plays the distinguishing game on the same upload
function the engines call, with everything the server receives, on neighbouring client
datasets under a stated adjacency, and compares a 95% Clopper–Pearson lower bound on ε with
the ε the client's privacy events claim. ``privaterec privacy audit`` is its CLI.
"""

from privaterec.audit.distinguisher import (DistinguisherResult, bound_ceiling,
                                                        distinguish)
from privaterec.audit.runner import (Claim, PairAudit, audit_pair, audit_target,
                                                 claimed_budget, flatten_sent, format_table,
                                                 run_audit)
from privaterec.audit.targets import (METHODS, MODES, Release, Target,
                                                  make_target, sent_fields)
from privaterec.audit.world import (ADJACENCIES, AuditWorld, NeighbourPair,
                                                make_world, neighbour_pairs)

__all__ = ["ADJACENCIES", "AuditWorld", "Claim", "DistinguisherResult", "METHODS", "MODES",
           "NeighbourPair", "PairAudit", "Release", "Target", "audit_pair", "audit_target",
           "bound_ceiling", "claimed_budget", "distinguish", "flatten_sent", "format_table",
           "make_target", "make_world", "neighbour_pairs", "run_audit", "sent_fields"]
