"""What both persysctl paths print, with the standard library only (the quick path imports these
too, so nothing here may load typer, rich, httpx or pydantic): the rows and columns of `get`
(`listing_rows`), tables drawn as rich would (`plain_table`), `describe` text (`describe_text`),
`-o json|yaml` documents (`printed_doc`) and `-o jsonpath` (`jsonpath`), terminal-safe cluster
text (`safe_text`) and the one line of a gateway's error answer (`refusal`).
"""
