"""Pure algorithmic building blocks: parameter spaces, masks, aggregation rules,
staleness functions and restoration triggers. No I/O, no clock, no runtime."""
