"""Side-by-side comparison with a PyTorch peer (TRL's GRPOTrainer): ``tunix-agentic
compare``. Everything that needs torch or trl is imported where it is used."""

from tunix_agentic.compare.batch import ParityBatch
from tunix_agentic.compare.mapping import KNOWN_DIFFERENCES, TRLMapping, trl_mapping
from tunix_agentic.compare.parity import LossParity, loss_parity
from tunix_agentic.compare.report import CompareResult
from tunix_agentic.compare.run import PEERS, compare

__all__ = [
    "KNOWN_DIFFERENCES",
    "PEERS",
    "CompareResult",
    "LossParity",
    "ParityBatch",
    "TRLMapping",
    "compare",
    "loss_parity",
    "trl_mapping",
]
