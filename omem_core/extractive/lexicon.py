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

CUE_WORDS = frozenset(
    """favorite favourite love loves loved prefer prefers preferred hate hates hated enjoy enjoys
    enjoyed plan plans planned planning decided decide decision bought buy buying moved move
    moving started start starting finished finish joined join adopted adopt visited visit went
    made make painted paint signed married born birthday job work working career school college
    university degree kids kid daughter son wife husband partner friend friends mom dad mother
    father family brother sister dog cat pet name named live lives lived living recently deadline
    budget allergic need needs want wants goal goals learned learning course class team project
    trip travel traveled vacation concert book books read reading wrote writing play plays played
    game games instrument music song car house apartment city country home hobby passion volunteer
    volunteering charity camping hiking running marathon race event conference meeting interview
    promoted promotion quit hired salary cost price paid pay dollars version library framework
    database deploy deployed bug error fixed issue release""".split()
)
