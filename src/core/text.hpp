// Small string helpers: edit distance for "did you mean" suggestions, trimming, splitting.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace laoyao {

// Levenshtein distance (insert, delete, substitute each cost 1).
size_t edit_distance(std::string_view a, std::string_view b);

// The candidate closest to `name`, or "" when none is close enough to be a plausible typo
// (distance at most max(2, |name|/3)).
std::string nearest(std::string_view name, const std::vector<std::string>& candidates);

// " (did you mean X?)" or "" — appended to "unknown ..." messages.
std::string did_you_mean(std::string_view name, const std::vector<std::string>& candidates);

std::string trim(std::string_view s);
// c's UTF-8 bytes appended to out.
void append_utf8(std::string& out, char32_t c);
std::vector<std::string> split(std::string_view s, char sep);
bool starts_with(std::string_view s, std::string_view prefix);
bool ends_with(std::string_view s, std::string_view suffix);
std::string join(const std::vector<std::string>& parts, std::string_view sep);
// The first `max` bytes of `s`, and "..." when there was more: hostile input quoted in a message
// can be megabytes long.
std::string shorten(std::string_view s, size_t max);

}  // namespace laoyao
