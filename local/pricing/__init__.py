"""What Breakwater costs: the price table (``prices.json``), usage counting (``usage``), pricing."""
