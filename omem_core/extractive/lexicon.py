"""Word lists used by the extractive baseline (English)."""

from __future__ import annotations

MONTHS = (
    "january", "february", "march", "april", "may", "june", "july", "august", "september",
    "october", "november", "december",
)
WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")

STOP_WORDS = frozenset(
    """a about above after again against all am an and any are aren't as at be because been before
    being below between both but by can can't cannot could couldn't did didn't do does doesn't doing
    don't down during each few for from further had hadn't has hasn't have haven't having he he'd
    he'll he's her here here's hers herself him himself his how how's i i'd i'll i'm i've if in into
    is isn't it it's its itself let's me more most mustn't my myself no nor not of off on once only
    or other ought our ours ourselves out over own same shan't she she'd she'll she's should
    shouldn't so some such than that that's the their theirs them themselves then there there's
    these they they'd they'll they're they've this those through to too under until up very was
    wasn't we we'd we'll we're we've were weren't what what's when when's where where's which while
    who who's whom why why's with won't would wouldn't you you'd you'll you're you've your yours
    yourself yourselves just also really so yeah yes oh hey hi hello well ok okay sure like get got
    go going gonna one thing things much many lot lots still even way know think mean""".split()
)

FILLER_WORDS = frozenset(
    """thanks thank wow awesome cool great amazing glad congrats congratulations haha lol nice
    sounds fantastic wonderful incredible super totally absolutely definitely appreciate happy
    hear glad sweet lovely""".split()
)

# Abbreviations written with a full stop that does not end a sentence (titles, street and place
# words, Latin, measures). "no" counts only before a digit ("No. 5").
ABBREVIATIONS = frozenset(
    """mr mrs ms mx dr prof rev hon st sr jr mt ft ave blvd rd ln hwy apt dept univ inc ltd co corp
    bros assn gen col lt sgt capt cmdr gov sen rep pres vs etc e.g i.e cf viz approx est min max
    fig vol ed eds pp no nos jan feb mar apr jun jul aug sep sept oct nov dec mon tue tues wed thu
    thur thurs fri sat sun a.m p.m u.s u.k""".split()
)

# Very common English content words: they say little on their own ("a really good time"). A
# sentence made only of these is a pleasantry ("See ya later!") and is not picked as a note. (How
# much a word weighs in the choice of notes comes from the tokenizer's vocabulary instead:
# ``algorithm.rarity``.)
GENERIC_WORDS = frozenset(
    """able actually ago ahead almost alone along already always amazing another anything anyway
    anywhere around away awesome back bad beautiful best better big bit came can come comes coming
    could day days definitely different done else enough especially ever every everyone everything
    exactly excited feel feeling feelings feels felt find fine first found fun gave getting give
    gives giving glad good great guess guys happen happened happens happy hard heard help helped
    helps hope hoping huge idea important interesting keep keeps kind kinds last later least leave
    left less let life little long look looked looking looks lot lots love loved lovely made make
    makes making may maybe means meant might moment moments months much must need needed never new
    next nice nothing now often old others part people perfect person pretty put quite rather ready
    real really right said say saying says see seeing seem seems seen set show showed shows since
    small something sometimes soon sort special stuff sure take takes taking talk talked talking
    tell thanks thank things think thinking thought time times today together told took tried try
    trying turn two use used using want wanted wants watch way ways week weeks went whole wish
    without wonderful work worked working world would wow year years yet""".split()
)

# Words that start a message as a label, not as a speaker's name ("Noted: plan peanut-free meals",
# "Update: the flight moved"). Capitalised, one of these names a speaker only when it starts
# several messages of a segment (a chat between "Will" and "Grace" still parses).
LABEL_WORDS = frozenset(
    """note noted notes update updated reminder tip tips ps fyi warning caution answer question
    summary edit todo done step plan result example important info heads correction context
    background recap reply response status""".split()
)
