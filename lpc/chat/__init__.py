"""Chat conversations into token requests: the paper's ShareGPT workload.

Tokenisers (`tokenizers`), the chat template that turns a conversation's turns into prompt
token ids (`tokenization`), the on-disk cache of those ids (`token_cache`) and the
conversation workload the A/B replays (`conversation_workload`). Depends on `training`'s
loaders and the shared request records (`lpc.workload`), never on the replay engine.
"""
