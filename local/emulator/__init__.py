"""What stands in for AWS: the stack synthesized and created in moto, its functions, mappings and API."""
