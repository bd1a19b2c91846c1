"""millstream's errors: one tree, shared with the model (see ``millstream.model.errors``)."""

from millstream.model.errors import *  # noqa: F403  (the tree is defined once, in the model package)
from millstream.model.errors import __all__ as __all__
