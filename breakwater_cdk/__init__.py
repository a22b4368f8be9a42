"""Breakwater as a CDK construct library: ``Breakwater(self, "Orders", config=..., processor=...)``.

The construct builds the whole system in the caller's stack; ``BreakwaterConfig`` is its typed
configuration (what cdk.json's ``breakwater`` object is validated into, see ``load_config``).
"""

from breakwater_cdk.assets import VERSION
from breakwater_cdk.config import BlueprintConfig as BreakwaterConfig
from breakwater_cdk.config import ConfigError, load_config
from breakwater_cdk.construct import Breakwater
from breakwater_cdk.processor import Processor

__version__ = VERSION
__all__ = ["Breakwater", "BreakwaterConfig", "ConfigError", "Processor", "__version__", "load_config"]
