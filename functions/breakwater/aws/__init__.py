"""Adapters: the only modules that talk to AWS (boto3). Policy modules never import these."""
