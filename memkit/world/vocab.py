"""The synthetic world's vocabulary: the data tables :mod:`memkit.world.generator` draws from.

What a world can say, apart from how it is drawn: the entity types and their attributes (how a
passage states a fact and how a question asks for it), the ranges and word lists literal values
come from, the syllables fictional names are made of (and the real words they must not be), the
fact-free sentences that pad a page, and the distractor pages. Changing a row here changes the
world (and the tasks) that a seed generates.
"""

from __future__ import annotations

from dataclasses import dataclass

TYPES = ("person", "city", "company", "film", "band", "university")


@dataclass(frozen=True)
class Attr:
    """One attribute or relation kind.

    ``target`` is an entity type for relations (value = that entity's name) or None for
    literals. ``kw`` occurs in every sentence template, so "<name> <kw>" retrieves the
    page. ``phrase`` (relations only) describes the value for bridge questions, e.g.
    "the director of {s}"; ``compare`` = (question template, "min" | "max") for numbers.
    """

    name: str
    etype: str
    target: str | None
    kw: str
    question: str
    sentences: tuple[str, ...]
    phrase: str = ""
    compare: tuple[str, str] | None = None


# A table, one attribute a row: (name, entity type, target type, keyword, question), then its
# sentence templates, then the bridge phrase or the comparison; kept as it reads (not one argument a line):
# fmt: off
ATTRS: tuple[Attr, ...] = (
    Attr("birth_year", "person", None, "born", "In which year was {s} born?",
         ("{n} was born in {v}.", "{n} was born in the year {v}."),
         compare=("Who was born earlier, {a} or {b}?", "min")),
    Attr("birth_city", "person", "city", "birthplace", "In which city was {s} born?",
         ("The birthplace of {n} is {v}.", "{n} has {v} as birthplace."),
         phrase="the city where {s} was born"),
    Attr("employer", "person", "company", "works", "Which company does {s} work for?",
         ("{n} works for {v}.", "{n} works at {v}."),
         phrase="the employer of {s}"),
    Attr("alma_mater", "person", "university", "studied", "Where did {s} study?",
         ("{n} studied at {v}.", "As a student, {n} studied at {v}."),
         phrase="the university where {s} studied"),
    Attr("occupation", "person", None, "profession", "What is the profession of {s}?",
         ("By profession, {n} is a {v}.", "{n} is a {v} by profession.")),
    Attr("population", "city", None, "population", "What is the population of {s}?",
         ("{n} has a population of {v}.", "The population of {n} is {v}."),
         compare=("Which city has a larger population, {a} or {b}?", "max")),
    Attr("mayor", "city", "person", "mayor", "Who is the mayor of {s}?",
         ("The mayor of {n} is {v}.", "{v} serves as the mayor of {n}."),
         phrase="the mayor of {s}"),
    Attr("country", "city", None, "country", "In which country is {s}?",
         ("{n} is a city in the country of {v}.", "{n} lies in {v}, a small country.")),
    Attr("river", "city", None, "river", "Which river flows through {s}?",
         ("The {v} river flows through {n}.", "{n} was built on the banks of the {v} river.")),
    Attr("founded_year", "company", None, "founded", "In which year was {s} founded?",
         ("{n} was founded in {v}.", "{n} has been in business since it was founded in {v}."),
         compare=("Which company was founded earlier, {a} or {b}?", "min")),
    Attr("founder", "company", "person", "founder", "Who is the founder of {s}?",
         ("The founder of {n} is {v}.", "{v} is the founder of {n}."),
         phrase="the founder of {s}"),
    Attr("headquarters", "company", "city", "headquarters", "In which city is {s} headquartered?",
         ("{n} has its headquarters in {v}.", "The headquarters of {n} are in {v}."),
         phrase="the city where {s} has its headquarters"),
    Attr("industry", "company", None, "industry", "In which industry does {s} operate?",
         ("{n} works in the {v} industry.", "{n} is a company in the {v} industry.")),
    Attr("employees", "company", None, "employees", "How many employees does {s} have?",
         ("{n} has {v} employees.", "About {v} employees work at {n}."),
         compare=("Which company has more employees, {a} or {b}?", "max")),
    Attr("release_year", "film", None, "released", "In which year was {s} released?",
         ("{n} was released in {v}.", "{n} was released in cinemas in {v}."),
         compare=("Which film was released earlier, {a} or {b}?", "min")),
    Attr("director", "film", "person", "directed", "Who directed {s}?",
         ("{n} was directed by {v}.", "{v} directed {n}."),
         phrase="the director of {s}"),
    Attr("film_genre", "film", None, "genre", "What is the genre of {s}?",
         ("The genre of {n} is {v}.", "By genre, {n} is a {v}.")),
    Attr("studio", "film", "company", "produced", "Which company produced {s}?",
         ("{n} was produced by {v}.", "{v} produced {n}."),
         phrase="the company that produced {s}"),
    Attr("runtime", "film", None, "minutes", "How many minutes long is {s}?",
         ("{n} runs for {v} minutes.", "{n} is {v} minutes long."),
         compare=("Which film is longer, {a} or {b}?", "max")),
    Attr("formed_year", "band", None, "formed", "In which year was {s} formed?",
         ("{n} was formed in {v}.", "{n} formed in {v}."),
         compare=("Which band was formed earlier, {a} or {b}?", "min")),
    Attr("hometown", "band", "city", "hometown", "Which city is the hometown of {s}?",
         ("The hometown of {n} is {v}.", "{n} calls {v} its hometown."),
         phrase="the hometown of {s}"),
    Attr("lead_singer", "band", "person", "singer", "Who is the lead singer of {s}?",
         ("The lead singer of {n} is {v}.", "{v} is the lead singer of {n}."),
         phrase="the lead singer of {s}"),
    Attr("music_genre", "band", None, "music", "What kind of music does {s} play?",
         ("{n} plays {v} music.", "{n} is known for playing {v} music.")),
    Attr("established_year", "university", None, "established", "In which year was {s} established?",
         ("{n} was established in {v}.", "{n} was first established in {v}."),
         compare=("Which university was established earlier, {a} or {b}?", "min")),
    Attr("campus_city", "university", "city", "campus", "In which city is the campus of {s}?",
         ("The campus of {n} is in {v}.", "{n} has its campus in {v}."),
         phrase="the city where {s} has its campus"),
    Attr("president", "university", "person", "president", "Who is the president of {s}?",
         ("The president of {n} is {v}.", "{v} is the president of {n}."),
         phrase="the president of {s}"),
    Attr("students", "university", None, "students", "How many students attend {s}?",
         ("{n} has {v} students.", "About {v} students attend {n}."),
         compare=("Which university has more students, {a} or {b}?", "max")),
)
# fmt: on
ATTR_BY_NAME = {a.name: a for a in ATTRS}
SUBJECT = {"film": "the film {n}"}  # how a question names an entity

# ---- literal values: integer ranges and word lists, by attribute -------------------------------
NUMBERS = {
    "birth_year": (1900, 1995),
    "population": (2000, 2000000),
    "founded_year": (1850, 2010),
    "employees": (20, 50000),
    "release_year": (1950, 2020),
    "runtime": (75, 190),
    "formed_year": (1960, 2015),
    "established_year": (1500, 1990),
    "students": (500, 40000),
}
WORDS = {
    "occupation": "painter chemist lawyer sailor teacher baker pilot surgeon poet farmer banker journalist".split(),
    "industry": ["shipping", "textile", "mining", "software", "banking", "railway", "tea", "glass"],
    "film_genre": ["comedy", "drama", "western", "thriller", "musical", "documentary", "romance"],
    "music_genre": ["jazz", "folk", "rock", "blues", "punk", "soul", "reggae", "disco"],
}

# ---- names: syllables, and the words a name must not be ----------------------------------------
FILM_NOUNS = ["Hours", "Tide", "Garden", "Letter", "Winter", "Road", "Mirror", "Harbor", "Signal", "Orchard"]
COMPANY_SUFFIX = ["Works", "Group", "Industries", "Labs", "Holdings", "Systems"]

# Generated words are rejected if they are common English words or real names, so every
# name stays obviously fictional (a model cannot "know" it).
REAL_WORDS = set(
    """a an and are as at be but by for from had has have he her his i in is it its me my no not of on
or our she so that the them they this to was we were with you about after again also back been before big
came can come could day did down each even first good great here how into just know like little long made
make man many more most much must name new now old one only other over people said same see some still
such take than then there these thing think those time two under very well went what when where which who
will work would year your ball band bank bar base bat bear bed bell bird boat body bone book box boy bread
cake call car care cat city coat cold cook corn cow dark date deer door dog dove fire fish gold hand hat
home king lake land life lime line lion love mark mile milk mine moon note park pine rain rice ring road
rose salt sand sea seed ship shop sing sun tale tea tent tide tin toe tone town tree vote wall water wine
wood zone rome paris london tokyo berlin milan oslo lima cairo delhi john mary anna sara tom bob kim lee
ali omar maria elena peter paul mark luke adam eve noah liam emma olivia mia lena nora ivan igor sven
tina rita dora vera rosa bella luna stella mona lisa nina dana tara kara mara sami rami""".split()
)
ONSETS = "b d f g k l m n p r s t v z br dr kr st tr th sh".split()
VOWELS = ["a", "e", "i", "o", "u", "a", "e", "o"]
CODAS = ["", "", "", "n", "r", "l", "s", "th", "k", "m"]

# ---- filler: text with no facts in it ---------------------------------------------------------
# Fact-free colour sentences (no attribute keyword, no values): they make pages read like
# short wiki leads (~40-60 words) and give BM25 realistic non-matching text.
COLOUR = {
    "person": (
        "{n} is often mentioned in local records.",
        "Friends describe {n} as patient and curious.",
        "Little is known about the early life of {n}.",
    ),
    "city": (
        "{n} is a busy place with markets, bridges and old stone houses.",
        "Visitors to {n} remember its narrow streets and quiet squares.",
    ),
    "company": (
        "{n} is known for its plain logo and long annual reports.",
        "Critics and admirers alike write about {n} in trade papers.",
    ),
    "film": (
        "Reviews of {n} praised its music and its slow opening scenes.",
        "{n} is still shown at small cinemas on rainy evenings.",
    ),
    "band": (
        "{n} are known for long concerts and handmade posters.",
        "Fans of {n} often trade old recordings at fairs.",
    ),
    "university": ("{n} is known for its library and its gardens.", "Many visitors walk through the old halls of {n}."),
}

# Distractor pages, (title, text) templates: they name two entities ({e1}, {e2}) but state no
# fact, so retrieval by a name alone is not enough to pick the right page.
DISTRACTORS = (
    (
        "{W} Festival",
        "The {t} is an old celebration held each spring in the hills. People bring bread, "
        "lanterns and painted boats. Stories say that {e1} once danced there until dawn, and that {e2} lost a "
        "hat in the crowd. Nobody agrees on where the celebration began, and each village tells its own tale.",
    ),
    (
        "{W} Pass",
        "The {t} is a mountain road known for cold winds and narrow paths. Travellers leave small "
        "stones at the top for luck. A diary attributed to {e1} describes the view, and a letter signed by {e2} "
        "complains about the weather. The road is closed for most of the winter.",
    ),
    (
        "{W}",
        "{t} is a board game played with black and white tokens on a square grid. Players take turns and "
        "try to surround the tokens of the other side. {e1} is said to have played it often, and {e2} wrote a "
        "short note on its rules. The game has many local variants.",
    ),
    (
        "{W} Pie",
        "{t} is a sweet dish made from oats, honey and baked apples, served warm on holidays. An old "
        "cookbook says that {e1} liked it with cream, while {e2} preferred it cold. Recipes differ from one "
        "kitchen to the next, and every family claims its own is the best.",
    ),
    (
        "The {W}",
        "{t} was a wooden sailing ship with three masts and a red flag. Sailors told many stories "
        "about it. One such story claims that {e1} travelled on board and that {e2} painted its figurehead. "
        "The ship is now remembered mainly in sea songs.",
    ),
    (
        "Legend of {W}",
        "The {t} tells of a fox who stole the moon and hid it in a well. Children hear it on "
        "long nights. Some tellers add that {e1} found the well, others that {e2} lowered a bucket and brought "
        "the moon back. The ending changes with every telling.",
    ),
)
