"""Which line of the user's code runs now, while a forward is watched.

The innermost frame of the user's code names the line (also inside helper functions the
forward calls). A library module that a container runs (``nn.Sequential``, PyG's
``Sequential``) has no line of the user's on the stack: it is named by the line that built
it (:mod:`fxquant.linter.sites`), and the finding says which module it is and how to build
it out of place. A GraphModule run node by node falls back to the node's recorded stack.
"""

from __future__ import annotations

from types import FrameType

from torch import nn
from torch.fx import Node

from fxquant.fx.locations import Location, caller_location, stack_trace_location
from fxquant.linter.rules import hint_for_inplace, strip_comment
from fxquant.linter.sites import ModuleSite, container_site

__all__ = ["Locator"]


class Locator:
    """The user's line for what runs now, and what ran on each line."""

    def __init__(self) -> None:
        self.node: Node | None = None  # the FX node being run, for GraphModules
        self.boundary: FrameType | None = None  # frames outside this are not the model's
        self.module_names: dict[int, str] = {}  # id(module) -> its qualified name
        self.modules: dict[str, nn.Module] = {}
        #: construction lines of library modules run by containers -> what ran there
        self.sites: dict[Location, ModuleSite] = {}
        #: the same for modules whose construction line is unknown, by (call, node)
        self.unlocated: dict[tuple[str, str], ModuleSite] = {}
        #: lines where torch calls ran with autograd off, and with it on
        self.lines_without_grad: set[Location] = set()
        self.lines_with_grad: set[Location] = set()

    def know_model(self, model: nn.Module) -> None:
        """Learn the model's modules (to name those its containers run)."""
        self.modules = dict(model.named_modules())
        self.module_names = {id(m): name for name, m in self.modules.items()}

    def where(self) -> Location | None:
        """The user's line for what runs now: the innermost user frame, or, for a library
        module a container runs (``nn.Sequential``), the line that built the module."""
        if self.module_names:
            site = container_site(self.boundary, self.module_names, self.modules)
            if site is not None and site.line is not None:
                self.sites[site.line] = site  # latest: one line may build many
                return site.line
        found = caller_location(self.boundary)
        if found is not None:
            return found
        if self.node is not None:
            return stack_trace_location(self.node.meta.get("stack_trace"))
        return None

    def here(self, default: str) -> tuple[Location | None, str]:
        """The user's line running now, and its code without comment (``default`` where
        no line of the user's is on the stack)."""
        where = self.where()
        return where, strip_comment(where.code) if where else default

    def node_name(self, fallback: str) -> str:
        """The FX node being run (``fallback`` outside a GraphModule)."""
        return self.node.name if self.node is not None else fallback

    def ran(self, grad_enabled: bool) -> None:
        """Note that a torch call runs on the current line with autograd on or off."""
        line = self.where()
        if line is not None:
            (self.lines_with_grad if grad_enabled else self.lines_without_grad).add(line)

    @property
    def no_grad_lines(self) -> set[Location]:
        """Lines whose torch calls all ran with autograd off (``with torch.no_grad():`` in
        the user's code). A line calling a module whose library code turns autograd off
        for a while (a custom Function's forward, a full backward hook's) also ran calls
        with autograd on, and is not one."""
        return self.lines_without_grad - self.lines_with_grad

    def remember_unlocated(self, code: str, node: str) -> None:
        """For a call no user line made: the module a container runs, if that is what
        runs, by ``(code, node)``."""
        if not self.module_names:
            return
        site = container_site(self.boundary, self.module_names, self.modules)
        if site is not None:
            self.unlocated[(code, node)] = site

    def write_site(self, code: str, where: Location | None, node: str,
                   op: str) -> tuple[str, str]:
        """What wrote (the module a container ran, or the code) and how to fix it."""
        site = self.sites.get(where) if where is not None else self.unlocated.get((code, node))
        what = site.describe() if site is not None else f"`{code}`"
        hint = hint_for_inplace(code, op)
        if site is not None and site.switched_at is not None:
            hint = (f"`{site.switched_at.code}` makes this {site.kind} write in place: leave "
                    f"{site.kind} out of it (inplace=False), so the container passes a new "
                    "tensor on")
        elif site is not None and site.fixed:
            hint = (f"build it with inplace=False: `{site.fixed}` (the container then passes "
                    "a new tensor on)")
        return what[:1].upper() + what[1:], hint
