"""Max KV tokens with online C128 on and off, from sglang's own pool-sizing formulas."""
