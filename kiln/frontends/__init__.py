"""Frontends: framework models in, kiln `Graph` out. A frontend hands the pipeline
(kiln.compiler) a Graph and never calls it back; what drives the pipeline from a framework
(the torch.compile backend, kiln.dynamo) sits above it."""
