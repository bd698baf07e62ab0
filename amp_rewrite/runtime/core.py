"""The runtime as one value: what was asked for, what was chosen, and the rewrites' configuration.

:func:`amp_rewrite.runtime.enable` makes one :class:`Runtime` from the
settings (read from the environment once, or given); when TensorFlow is
imported the target is chosen for the machine and the rewrites' base
:class:`amp_rewrite.Config` is read, once, from TensorFlow's
``TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_*`` variables. The installers are
given this value; none of the runtime's modules reaches back into the
runtime package for its settings. :func:`amp_rewrite.runtime.disable` drops
it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from amp_rewrite.config import Config
from amp_rewrite.runtime.settings import RuntimeSettings
from amp_rewrite.runtime.target import TargetChoice


@dataclass
class Runtime:
    """The runtime while it is enabled.

    Attributes:
        requested: the settings it was enabled with (the target may be ``auto``).
        choice: the target chosen for this process and why; None until TensorFlow is imported.
        base_config: the rewrites' configuration, read when the target was chosen.
    """

    requested: RuntimeSettings
    choice: TargetChoice | None = None
    base_config: Config | None = None

    def choose(self, choice: TargetChoice, *, device_type: str) -> None:
        """Records the target chosen; with one, reads the rewrites' configuration for ``device_type``."""
        self.choice = choice
        if choice.target is not None:
            config = Config.from_env(device_type=device_type, target=choice.target, **self.requested.rewrite_fields())
            # strict mode promises the postconditions, however the settings were given
            self.base_config = replace(config, is_checking=config.is_checking or self.requested.is_strict)

    @property
    def target(self) -> str | None:
        """``float16`` or ``bfloat16`` once chosen; None before, and when scripts run float32."""
        return self.choice.target if self.choice is not None else None

    @property
    def settings(self) -> RuntimeSettings:
        """The settings, with the chosen target in place of ``auto`` once there is one."""
        target = self.target
        return self.requested if target is None else replace(self.requested, target=target)

    @property
    def target_reason(self) -> str:
        """Why the target is what it is, for the log."""
        return self.choice.reason if self.choice is not None else f"{self.requested.target} was requested"

    def rewrite_config(self, **fields) -> Config:
        """The base configuration with ``fields`` replaced (a fetch set, a device type, ...)."""
        if self.base_config is None:
            raise RuntimeError("the runtime has no target yet: TensorFlow is not imported or scripts run float32")
        return replace(self.base_config, **fields)
