"""Breakwater's runtime library: pure policy modules plus the adapters (``breakwater.aws``) that own boto3.

Shared by every Lambda handler, the replay job and the embedded local runtime, so behaviour
measured locally is the behaviour deployed.
"""

# The one version of the package, the runtime library and its Lambda layer (CHANGELOG.md).
__version__ = "0.2.0"
