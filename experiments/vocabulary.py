"""The vocabulary of the generated topic text (``sample_data.py topics``) and its tokenizer.

Pure Python: the data generator (control plane) and the text classifier (agent) share it.
Id 0 is padding, 1 an unknown word; words follow in the order listed here.
"""

from typing import List

PAD, UNKNOWN = 0, 1


def _words(text: str) -> List[str]:
    return text.split()


COMMON_WORDS = _words(
    "the a an and or but of to in on at for with from by about as into like through after over between "
    "out against during without before under around among is was are were be been being have has had "
    "do does did will would can could should may might must shall this that these those it its they "
    "them their we our you your he she his her i me my very more most some any many much few other"
)
TOPIC_WORDS = (
    _words("match goal team coach season player score league referee stadium ball win defeat tournament"),
    _words("recipe oven flour butter sugar bake salt pepper garlic onion simmer roast dough spice"),
    _words("orbit rocket planet moon galaxy telescope astronaut launch comet star gravity nebula satellite"),
    _words("melody guitar chord rhythm singer piano concert album drum tempo harmony lyric band"),
)
VOCABULARY = ["<pad>", "<unk>", *COMMON_WORDS, *(word for words in TOPIC_WORDS for word in words)]
_IDS = {word: index for index, word in enumerate(VOCABULARY)}


def tokenize(text: str) -> List[int]:
    """Lower-cased whitespace words as vocabulary ids (unknown words as 1)."""
    return [_IDS.get(word, UNKNOWN) for word in text.lower().split()]
