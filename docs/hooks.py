"""MkDocs hook: the configuration reference page is rendered from the loaders' own tables
(c2dtn.confref), so the page cannot drift from what the loaders accept."""

MARK = "<!-- c2dtn:config-reference -->"


def on_page_markdown(markdown: str, page, config, files) -> str:
    if MARK in markdown:
        from c2dtn.confref import markdown as reference

        return markdown.replace(MARK, reference())
    return markdown
