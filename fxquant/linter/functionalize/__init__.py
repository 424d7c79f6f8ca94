"""Rewrite a model so its forward has no in-place ops, and prove it: :func:`functionalize_inplace`.

Four steps, a module each:

1. **Diagnose** (:mod:`~fxquant.linter.functionalize.diagnose`) with the autograd check's
   protected run (:func:`fxquant.check`'s second run): it records every in-place call with
   its source line and gives the gradients the forward's own values imply, also where the
   real backward crashes. Writes that no rewrite can make equivalent are refused here,
   naming the line: writes into a leaf that requires grad and writes autograd does not see
   (``.data``, a ``.detach()``ed alias, no_grad) that change gradients, whose intended
   gradient only the author knows.
2. **Rewrite symbolically** (:mod:`~fxquant.linter.functionalize.rewrite`) on the
   :func:`fxquant.trace` graph, which keeps the module structure: in-place methods and
   functions become out of place (``x.add_(y)`` -> ``x.add(y)``), ``x[idx] = v`` writes
   into a copy, ``inplace=True`` flags and modules become ``inplace=False``, ``out=`` is
   dropped. ``x += y``, which symbolic tracing records as an out-of-place add, is
   recognized from the recorded run by its source line. Every later read of the written
   value, of the tensor it is a view of, and of the other views of that tensor, reads the
   new value: a write through a view (slicing, ``chunk``, ``split``, ``view``, ``reshape``
   ...) is scattered back into its base with ``index_put`` at the positions the view
   covers, found at run time from the view's strides, and the other views are gathered
   again from the new base (:mod:`~fxquant.linter.functionalize.graph_ops`). Writes into
   buffers (running statistics, queues) are module state and stay as they are.
3. **Capture** (:mod:`~fxquant.linter.functionalize.capture`) when symbolic tracing fails
   or its rewrite does not verify: the real forward, recorded on the example inputs by
   :func:`torch.func.functionalize` under ``make_fx`` (ATen ops, no mutations; specialized
   to the example's shapes, the branches taken on them and its non-tensor arguments:
   called with others, it raises).
4. **Verify** (:mod:`~fxquant.linter.functionalize.verify`) the candidate on the example
   inputs, from the same RNG state: the outputs (values, dtypes, ``requires_grad``), the
   buffers after forward, and every parameter's and input's gradient must match the
   reference (the protected run's gradients; where the original forward itself raises, a
   dot-product test against forward-mode AD of the original). A candidate that differs is
   never returned: :class:`FunctionalizeError`.

:func:`functionalize_inplace` (:mod:`~fxquant.linter.functionalize.inplace`) runs them.
``gm.meta["fxquant_rewrites"]`` lists the :class:`Rewrite` s made (line, before, after);
``gm.meta["fxquant_functionalized"]`` says how (``"symbolic"`` or ``"captured"``).
"""

from fxquant.linter.functionalize.capture import CapturedMode
from fxquant.linter.functionalize.graph_ops import (
    NOT_A_VIEW,
    call_on_copy,
    copy_functional,
    gather_view,
    inplace_on_copy,
    keep_dtype,
    scatter_view,
    setitem_on_copy,
    view_index,
    without_grad,
)
from fxquant.linter.functionalize.inplace import functionalize_inplace
from fxquant.linter.functionalize.outcome import (
    HOW_KEY,
    KEPT_KEY,
    REWRITES_KEY,
    FunctionalizeError,
    Rewrite,
)

#: Models functionalized and saved before the steps had modules of their own call these
#: functions under this module's name (``torch.load`` of a pickled GraphModule imports them
#: from here).
_copy_functional = copy_functional

__all__ = [
    "HOW_KEY",
    "KEPT_KEY",
    "NOT_A_VIEW",
    "REWRITES_KEY",
    "CapturedMode",
    "FunctionalizeError",
    "Rewrite",
    "call_on_copy",
    "copy_functional",
    "functionalize_inplace",
    "gather_view",
    "inplace_on_copy",
    "keep_dtype",
    "scatter_view",
    "setitem_on_copy",
    "view_index",
    "without_grad",
]
