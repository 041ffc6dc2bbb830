"""Server strategies: which sub-model each client gets and how replies fold into the global model."""
