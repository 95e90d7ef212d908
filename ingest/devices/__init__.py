"""What devices publish: rules, formats, presets, their state, check, discover."""
