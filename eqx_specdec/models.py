"""Models as the decoding loop and the verification meet them: the cached-model
interface, model-free and wrapped drafters, and drafts from another vocabulary (mapped
token by token, or verified at the string level)."""

from ._models.cached import (
    AbstractCachedModel as AbstractCachedModel,
    AbstractPackedModel as AbstractPackedModel,
    Packing as Packing,
)
from ._models.prompt_lookup import PromptLookupDraft as PromptLookupDraft
from ._models.suffix import SuffixDraft as SuffixDraft
from ._models.tempered import Tempered as Tempered
from ._models.warped import Warped as Warped
from ._vocabularies.draft_vocabulary import (
    DraftVocabulary as DraftVocabulary,
    SharedVocabulary as SharedVocabulary,
)
from ._vocabularies.string_level import StringLevelDraft as StringLevelDraft
