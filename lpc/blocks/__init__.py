"""The prefix-caching block manager with vLLM v1 semantics, and its block hashing.

`block_manager.BlockManager` keeps the pool, the hash → block table and the reference counts,
and hands every free block to an evictor from `eviction/`; `hashing` chains block hashes the
way vLLM does. Depends only on `eviction`: the replay engine and the difftest harness build
on it.
"""
