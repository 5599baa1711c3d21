"""llama.cpp's speculative modes (``--spec-type`` names, common/speculative.cpp), shared by the
arms (app.core.records.arm) and the drafter checks (app.core.machine.drafter). A newer binary may
list more; the engines check each against its own --help."""

SPEC_TYPES = ("none", "draft-simple", "draft-eagle3", "draft-mtp", "draft-dflash", "draft-dspark", "ngram-simple",
              "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")
# modes that cannot run without a separate drafter file (-md); draft-mtp without one uses the
# target's own MTP heads, and the n-gram modes draft from the text itself
NEEDS_DRAFTER = frozenset({"draft-simple", "draft-eagle3", "draft-dflash", "draft-dspark"})
# what a drafter file of each kind (app.core.machine.modelinfo.drafter_kind; "model": an ordinary
# model) drafts with, first its own mode
DRAFTER_MODES = {"gemma4-assistant": ("draft-mtp",), "mtp-head": ("draft-mtp",), "eagle3": ("draft-eagle3",),
                 "dflash": ("draft-dflash",), "dspark": ("draft-dspark", "draft-dflash"), "model": ("draft-simple",)}
