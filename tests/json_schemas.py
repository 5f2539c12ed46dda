"""Twenty JSON schemas of the kinds applications ask for (nested objects, enums, bounded arrays,
numbers with ranges, required and optional fields, string patterns), each with a prompt. Strings
and arrays are bounded and most numbers are integers: a grammar allows a number endless decimals,
and the tests' random model takes them. Used by the
constrained-decoding tests (tiny model) and bench/grammar.py --validate (the default model)."""

from __future__ import annotations

NAME = {"type": "string", "maxLength": 40}
SHORT = {"type": "string", "maxLength": 24}


def obj(properties: dict, required: list[str] | None = None) -> dict:
    return {"type": "object", "properties": properties, "required": list(properties) if required is None else required,
            "additionalProperties": False}


SCHEMAS: list[tuple[str, str, dict]] = [
    ("person", "Describe a famous scientist.", obj({"name": NAME, "born": {"type": "integer", "minimum": 1000,
                                                                           "maximum": 2025}})),
    ("city", "Give facts about Paris.", obj({"city": NAME, "country": NAME,
                                             "population_millions": {"type": "number", "minimum": 0, "maximum": 50}})),
    ("weather", "Report the weather in London.", obj({
        "city": {"type": "string", "enum": ["London", "Paris", "Rome", "Berlin"]},
        "condition": {"type": "string", "enum": ["sunny", "cloudy", "rain", "snow"]},
        "celsius": {"type": "integer", "minimum": -40, "maximum": 50}})),
    ("todo", "List three chores for today.", obj({"tasks": {"type": "array", "items": SHORT, "minItems": 3,
                                                             "maxItems": 3}})),
    ("book", "Recommend a novel.", obj({"title": NAME, "author": NAME, "year": {"type": "integer", "minimum": 1500,
                                                                                "maximum": 2025},
                                        "genres": {"type": "array", "items": SHORT, "minItems": 1, "maxItems": 3}},
                                       ["title", "author"])),
    ("rgb", "Pick a colour.", obj({"name": SHORT, "rgb": {"type": "array", "items": {
        "type": "integer", "minimum": 0, "maximum": 255}, "minItems": 3, "maxItems": 3}})),
    ("yes_no", "Is the sky blue? Answer with a reason.", obj({"answer": {"type": "boolean"}, "reason": NAME})),
    ("order", "Write an order for two items.", obj({"order_id": {"type": "string", "pattern": "^ORD-[0-9]{4}$"},
                                                    "items": {"type": "array", "minItems": 1, "maxItems": 3,
                                                              "items": obj({"sku": {"type": "string",
                                                                                    "pattern": "^[A-Z]{3}-[0-9]{3}$"},
                                                                            "qty": {"type": "integer", "minimum": 1,
                                                                                    "maximum": 9}})}})),
    ("address", "Write a postal address.", obj({"street": NAME, "city": NAME, "zip": {"type": "string",
                                                                                     "pattern": "^[0-9]{5}$"},
                                                "country": {"type": "string", "enum": ["FR", "DE", "US", "JP"]}})),
    ("event", "Plan a meeting.", obj({"title": NAME, "date": {"type": "string",
                                                                "pattern": "^20[0-9]{2}-[01][0-9]-[0-3][0-9]$"},
                                      "attendees": {"type": "array", "items": NAME, "maxItems": 4},
                                      "online": {"type": "boolean"}}, ["title", "date"])),
    ("score", "Rate the film Casablanca.", obj({"film": NAME, "stars": {"type": "integer", "minimum": 1,
                                                                         "maximum": 5},
                                                "review": {"type": "string", "maxLength": 60}})),
    ("nested", "Describe a company and its CEO.", obj({"company": NAME, "ceo": obj({"name": NAME, "age": {
        "type": "integer", "minimum": 18, "maximum": 99}}), "founded": {"type": "integer", "minimum": 1800,
                                                                       "maximum": 2025}})),
    ("recipe", "Give a recipe for pancakes.", obj({"dish": NAME, "ingredients": {"type": "array", "minItems": 2,
                                                                                  "maxItems": 5, "items": obj({
        "name": SHORT, "grams": {"type": "integer", "minimum": 1, "maximum": 1000}})},
        "minutes": {"type": "integer", "minimum": 1, "maximum": 240}})),
    ("planet", "Describe Mars.", obj({"planet": {"type": "string", "enum": ["Mercury", "Venus", "Earth", "Mars"]},
                                      "moons": {"type": "integer", "minimum": 0, "maximum": 100},
                                      "habitable": {"type": "boolean"}})),
    ("translation", "Translate 'good morning' into French.", obj({"source": SHORT, "target": SHORT,
                                                                   "language": {"type": "string", "pattern":
                                                                                "^[a-z]{2}$"}})),
    ("optional", "Describe a cat.", obj({"name": SHORT, "age": {"type": "integer", "minimum": 0, "maximum": 30},
                                         "color": SHORT, "indoor": {"type": "boolean"}}, ["name"])),
    ("matrix", "Write a 2 by 2 matrix.", obj({"rows": {"type": "array", "minItems": 2, "maxItems": 2, "items": {
        "type": "array", "minItems": 2, "maxItems": 2, "items": {"type": "integer", "minimum": -9,
                                                                 "maximum": 9}}}})),
    ("product", "Describe a laptop for sale.", obj({"name": NAME, "price": {"type": "integer", "minimum": 0,
                                                                             "maximum": 10000},
                                                    "currency": {"type": "string", "enum": ["USD", "EUR", "GBP"]},
                                                    "in_stock": {"type": "boolean"}})),
    ("choice", "Pick a pet: cat, dog or fish.", obj({"pet": {"type": "string", "enum": ["cat", "dog", "fish"]},
                                                      "because": {"type": "string", "maxLength": 50}})),
    ("log", "Write a log entry for a failed login.", obj({
        "level": {"type": "string", "enum": ["debug", "info", "warning", "error"]},
        "code": {"type": "integer", "minimum": 100, "maximum": 599},
        "message": NAME, "user": {"anyOf": [NAME, {"type": "null"}]}})),
]
