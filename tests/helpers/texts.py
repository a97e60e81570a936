"""Text in the published corpora's layouts (a WikiText-2 article with its @-@ tokens)."""

from __future__ import annotations

ARTICLE = (" = Valkyria Chronicles III = \n Senjō no Valkyria 3 : Unrecorded Chronicles is a tactical role @-@ "
           "playing video game developed by Sega and Media.Vision for the PlayStation Portable . \n")

