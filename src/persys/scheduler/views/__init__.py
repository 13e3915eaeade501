"""What a replica shows: documents built from the mirror (pure), their typed shapes, pages,
which objects a change touches (the watch feed) and which trace an event joins."""
