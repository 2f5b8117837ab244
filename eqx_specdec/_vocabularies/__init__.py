"""Drafts from another vocabulary: mapped token by token into the target's, or verified at the string level."""
