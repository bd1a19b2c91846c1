"""millstream's errors: one tree, shared with the model (see ``millstream.model.errors``)."""

import millstream.model.errors as _errors
from millstream.model.errors import *  # noqa: F403  (the tree is defined once, in the model package)

__all__ = _errors.__all__
