"""Conversation loaders: ShareGPT, LMSys-Chat-1M, Chatbot-Arena and OpenAI-style messages.

Every loader produces `training.conversation.Conversation` objects cleaned by the same rules
(`training.loaders.cleaning`) and a `LoadReport` counting everything cleaned or skipped.
Start with `load_conversations`; `docs/data.md` describes formats, rules and report fields.
"""

from training.loaders.cleaning import MESSAGE_JOIN_SEPARATOR, ROLE_MAP
from training.loaders.load import (
    BUNDLED_SHAREGPT,
    DEFAULT_MAX_MESSAGE_CHARS,
    FORMATS,
    ConversationStream,
    check_source,
    load_conversations,
    open_conversations,
)
from training.loaders.report import (
    DatasetNotFoundError,
    DatasetUnavailableError,
    EmptyDatasetError,
    LoaderError,
    LoadReport,
    LoadResult,
    MalformedFileError,
    MalformedRecordError,
    SkipReason,
    UnknownFormatError,
)
from training.loaders.sharegpt import sharegpt_base_id, split_segment_id

__all__ = [
    "BUNDLED_SHAREGPT",
    "DEFAULT_MAX_MESSAGE_CHARS",
    "FORMATS",
    "MESSAGE_JOIN_SEPARATOR",
    "ROLE_MAP",
    "ConversationStream",
    "DatasetNotFoundError",
    "DatasetUnavailableError",
    "EmptyDatasetError",
    "LoadReport",
    "LoadResult",
    "LoaderError",
    "MalformedFileError",
    "MalformedRecordError",
    "SkipReason",
    "UnknownFormatError",
    "check_source",
    "load_conversations",
    "open_conversations",
    "sharegpt_base_id",
    "split_segment_id",
]
