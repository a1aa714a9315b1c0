"""k-response datasets: row formats, tokenisation and axolotl's loading and caching."""
