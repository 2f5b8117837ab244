"""A small chat prompt set with categories, as Spec-Bench groups its prompts: texts whose
answers reuse their context (summarise, extract, edit code), continue a pattern or a
text, or answer an open question. `benchmarks/bench_llm.py` times speculative decoding
on them; `python -m eqx_specdec record` records a real model's rows from them."""

import types


#: Chat prompts by category, four each (a read-only mapping of tuples).
CHAT_PROMPTS = types.MappingProxyType(
    {
        "summarise": (
            "Summarise in two sentences: The Eiffel Tower is a wrought-iron lattice tower "
            "on the Champ de Mars in Paris, France. It is named after the engineer Gustave "
            "Eiffel, whose company designed and built the tower from 1887 to 1889. Locally "
            "nicknamed the Iron Lady, it was constructed as the centrepiece of the 1889 "
            "World's Fair, and to crown the centennial anniversary of the French Revolution.",
            "Summarise this paragraph: Photosynthesis is the process by which green plants "
            "and some other organisms use sunlight to synthesize foods from carbon dioxide "
            "and water. Photosynthesis in plants generally involves the green pigment "
            "chlorophyll and generates oxygen as a byproduct. The process takes place in the "
            "chloroplasts of the leaves.",
            "Give a short summary: The Great Wall of China is a series of fortifications "
            "that were built across the historical northern borders of ancient Chinese "
            "states to protect against various nomadic groups from the Eurasian Steppe. "
            "Several walls were built from as early as the 7th century BC.",
            "Summarise: Python is a high-level, general-purpose programming language. Its "
            "design philosophy emphasizes code readability with the use of significant "
            "indentation. Python is dynamically typed and garbage-collected. It supports "
            "multiple programming paradigms, including structured, object-oriented and "
            "functional programming.",
        ),
        "extract": (
            "List every person named in this text, one per line: Marie Curie worked with "
            "Pierre Curie in Paris; later Irene Joliot-Curie and Frederic Joliot continued "
            "their research, and Albert Einstein praised Marie Curie's work.",
            "Extract the dates from this text as a list: The treaty was signed on 12 March "
            "1921, ratified on 4 June 1921 and came into force on 1 January 1922.",
            "Extract the product names and prices as 'name: price' lines: The shop sells "
            "the Alpha Kettle for 35 euros, the Beta Toaster for 49 euros and the Gamma "
            "Blender for 89 euros.",
            "Which cities are mentioned? Answer with a list: We flew from London to Madrid, "
            "took a train to Barcelona, then a ferry to Palma, and flew home via Paris.",
        ),
        "edit code": (
            "Rename the variable x to total in this code:\ndef add_all(values):\n    x = 0\n"
            "    for v in values:\n        x = x + v\n    return x\n",
            "Add type hints to this function:\ndef scale(values, factor):\n    result = []\n"
            "    for value in values:\n        result.append(value * factor)\n    return result\n",
            "Rewrite this loop as a list comprehension:\nsquares = []\nfor n in range(10):\n"
            "    if n % 2 == 0:\n        squares.append(n * n)\n",
            "Add a docstring to this function:\ndef area(width, height):\n    return width "
            "* height\n",
        ),
        "continue": (
            "Continue this list of numbers, one per line, up to twenty: one, two, three, "
            "four, five,",
            "Continue the pattern for ten more lines:\nstep 1: open the box\nstep 2: open "
            "the box\nstep 3: open the box\n",
            "Continue the story in a few sentences: The old lighthouse keeper climbed the "
            "stairs every night.",
            "Write the next lines of the poem: Roses are red, violets are blue,",
        ),
        "open question": (
            "What are three good habits for staying healthy?",
            "Why is the sky blue?",
            "Give me some tips for learning a new language.",
            "What should I pack for a weekend hiking trip?",
        ),
    }
)
