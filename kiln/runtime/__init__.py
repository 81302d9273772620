"""What runs compiled models: input validation, the model object, artifacts."""
from kiln.runtime.model import CompiledModel, TensorSpec  # noqa: F401
