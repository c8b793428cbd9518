"""The words of the documents' demo news: topics, their sentence templates, and the fillers.

Each topic has its own titles, sentence templates and attributions, so topics differ in
vocabulary (clustering can recover them); the templates' slots (``{company}``, ``{team}``,
``{city}`` ...) are filled from :data:`FILL`, and :data:`BOILERPLATE` lines and
:data:`SOURCES` attributions are what any newsroom adds to every topic.
"""

WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday"]

FILL = {
    "company": [
        "Northwind Capital",
        "Helix Robotics",
        "Orion Foods",
        "Bluewater Energy",
        "Kestrel Bank",
        "Vantage Motors",
        "Lumen Semiconductors",
        "Atlas Freight",
        "Crescent Pharma",
        "Summit Retail",
    ],
    "index": ["the S&P 500", "the Nasdaq Composite", "the FTSE 100", "the DAX", "the Nikkei 225"],
    "city": ["Chicago", "Denver", "Seattle", "Boston", "Atlanta", "Phoenix", "Miami", "Portland"],
    "team": [
        "the Harbor Hawks",
        "the River City Rovers",
        "the Granite Bears",
        "the Coastal Sharks",
        "the Metro Lions",
        "the Valley Falcons",
    ],
    "player": ["Marcus Reed", "Elena Ortiz", "Jamal Carter", "Sofia Lindqvist", "Theo Brennan"],
    "product": [
        "a foldable laptop",
        "a home battery system",
        "a voice assistant",
        "an AI chip",
        "a satellite phone",
        "a smart thermostat",
    ],
    "tech": ["Quanta Labs", "Pixelforge", "Nimbus Cloud", "Cobalt Systems", "Brightpath AI"],
    "condition": [
        "influenza",
        "measles",
        "heart disease",
        "type 2 diabetes",
        "asthma",
        "long COVID",
    ],
    "doctor": ["Dr. Priya Shah", "Dr. Owen Mills", "Dr. Hannah Cole", "Dr. Luis Moreno"],
    "official": [
        "Senator Ruth Alvarez",
        "Governor Tom Hadley",
        "Speaker Dana Whitfield",
        "Minister Ken Osei",
    ],
    "party": [
        "the Liberal Alliance",
        "the National Party",
        "the Progressive Union",
        "the Civic Front",
    ],
    "bill": [
        "the housing bill",
        "the budget package",
        "the election reform act",
        "the infrastructure plan",
    ],
    "storm": [
        "a cold front",
        "a tropical storm",
        "a heat dome",
        "an atmospheric river",
        "a blizzard",
    ],
}

TOPICS: dict[str, dict[str, list[str]]] = {
    "markets": {
        "titles": [
            "{company} shares jump after earnings",
            "Stocks slide as {index} retreats",
            "Investors weigh rate outlook as {index} moves {pct}%",
            "{company} cuts forecast, shares fall",
        ],
        "sentences": [
            "Shares of {company} rose {pct}% after quarterly earnings beat analyst estimates.",
            "{index} closed {pct}% lower as investors sold technology and bank stocks.",
            "Bond yields climbed to {num}% as traders priced in another interest rate increase.",
            "Analysts said {company} benefited from strong demand and lower costs.",
            "The central bank signalled that inflation remains above its target.",
            "Trading volume was heavy, with {num} million shares changing hands.",
            "{company} raised its full-year revenue guidance to ${num} billion.",
            "Oil prices fell {pct}% on concerns about weaker global demand.",
            "Investors rotated out of growth stocks and into dividend-paying utilities.",
            "The dollar strengthened against the euro and the yen in afternoon trading.",
            "Portfolio managers expect volatility to stay high until the next inflation report.",
            "Quarterly profit at {company} rose to ${num} million, up from a year earlier.",
        ],
        "sources": ["analysts at {company} said", "traders said", "according to market data"],
    },
    "weather": {
        "titles": [
            "{storm} to bring heavy rain to {city}",
            "Record temperatures expected in {city}",
            "Forecasters warn of flooding near {city}",
            "{city} braces for {storm}",
        ],
        "sentences": [
            "Forecasters expect {storm} to reach {city} by the weekend.",
            "The National Weather Service issued a flood warning for the {city} area.",
            "Temperatures in {city} could climb to {temp} degrees on Thursday afternoon.",
            "Up to {num} inches of rain may fall over the next two days.",
            "Wind gusts of {num} miles per hour could bring down trees and power lines.",
            "Residents near rivers were urged to move vehicles to higher ground.",
            "Meteorologists said humidity will make the heat feel even more intense.",
            "Snow and ice are likely on mountain passes east of {city}.",
            "Drought conditions have worsened across the region after weeks without rain.",
            "Emergency crews prepared sandbags and cooling centers ahead of the storm.",
            "The forecast calls for clearing skies and cooler air early next week.",
            "Airports in {city} reported delays as thunderstorms moved through the area.",
        ],
        "sources": [
            "forecasters said",
            "the weather service said",
            "according to emergency officials in {city}",
        ],
    },
    "sports": {
        "titles": [
            "{team} win thriller in overtime",
            "{player} leads {team} to victory",
            "{team} fall short in playoff opener",
            "Injury sidelines {player} for {team}",
        ],
        "sentences": [
            "{team} beat {team2} {score} in front of a sold-out crowd.",
            "{player} scored twice in the second half to seal the win.",
            "The coach praised the defense for holding the opponents scoreless in the final quarter.",
            "{player} is expected to miss {num} weeks with a hamstring injury.",
            "The victory moves {team} into first place in the division standings.",
            "Fans celebrated in the stadium long after the final whistle.",
            "The goalkeeper made {num} saves, including a diving stop in stoppage time.",
            "{team} have now won {num} straight games at home this season.",
            "The league will review the controversial penalty call from the third period.",
            "{player} signed a contract extension worth ${num} million over four years.",
            "Both teams struggled with turnovers in a tense, low-scoring first half.",
            "The playoff series resumes on Saturday with game two at the home arena.",
        ],
        "sources": [
            "the coach told reporters",
            "{player} said after the game",
            "according to the league",
        ],
    },
    "technology": {
        "titles": [
            "{tech} unveils {product}",
            "{tech} faces scrutiny over data practices",
            "Startups race to build {product}",
            "{tech} reports surge in cloud revenue",
        ],
        "sentences": [
            "{tech} unveiled {product} at its annual developer conference.",
            "The company said the new software uses machine learning to cut energy use by {pct}%.",
            "Engineers at {tech} spent {num} months redesigning the processor architecture.",
            "Privacy advocates raised concerns about how user data would be stored and shared.",
            "Cloud computing revenue at {tech} grew {pct}% from the previous quarter.",
            "The device will ship with a larger battery and a faster wireless chip.",
            "Developers can access the platform through a new programming interface.",
            "A security researcher disclosed a vulnerability affecting millions of smartphones.",
            "{tech} plans to open a data center near {city} to support demand for AI services.",
            "Chip shortages have delayed production of several consumer electronics products.",
            "The open-source release drew thousands of contributors within its first week.",
            "Regulators are examining whether the acquisition would reduce competition in software.",
        ],
        "sources": [
            "{tech} said in a blog post",
            "industry analysts said",
            "according to company engineers",
        ],
    },
    "health": {
        "titles": [
            "Study links diet to lower risk of {condition}",
            "Hospitals report rise in {condition} cases",
            "New treatment for {condition} shows promise",
            "Health officials urge vaccination",
        ],
        "sentences": [
            "Researchers found that patients with {condition} improved after {num} weeks of treatment.",
            "{doctor} said the clinical trial enrolled {num} patients across several hospitals.",
            "Health officials reported a {pct}% rise in {condition} cases this month.",
            "The study, published in a medical journal, followed participants for {num} years.",
            "Doctors recommend regular exercise and a balanced diet to reduce the risk.",
            "Hospitals in {city} have added beds to cope with the increase in admissions.",
            "{doctor} cautioned that larger trials are needed before the drug is approved.",
            "Vaccination clinics will stay open late to meet demand from families.",
            "Patients taking the medication reported fewer side effects than with standard care.",
            "Public health experts urged people with symptoms to stay home and get tested.",
            "{company} said it would seek regulatory approval for the therapy next year.",
            "Nurses described long shifts as emergency rooms filled with patients.",
        ],
        "sources": ["{doctor} said", "according to the health department", "researchers wrote"],
    },
    "politics": {
        "titles": [
            "Lawmakers debate {bill}",
            "{official} announces re-election bid",
            "{party} gains ground in new poll",
            "Vote on {bill} delayed",
        ],
        "sentences": [
            "Lawmakers debated {bill} for {num} hours before adjourning without a vote.",
            "{official} said the proposal would lower costs for working families.",
            "A new poll shows {party} leading with {pct}% support among likely voters.",
            "Opposition leaders criticised {bill} as too expensive and poorly planned.",
            "{official} announced a campaign for re-election at a rally in {city}.",
            "The committee approved an amendment to expand funding for public schools.",
            "Voters will head to the polls in {num} days to choose a new parliament.",
            "{party} accused the government of ignoring rural communities.",
            "The U.S. delegation met foreign ministers to discuss trade and security.",
            "Negotiators from both parties said a compromise on {bill} was within reach.",
            "The governor vetoed the measure, citing concerns about the state budget.",
            "Election officials said early turnout was higher than in previous years.",
        ],
        "sources": [
            "{official} told reporters",
            "according to party officials",
            "aides to {official} said",
        ],
    },
}

BOILERPLATE = [
    "This story has been updated with additional information.",
    "Officials said more details would be released later this week.",
    "The announcement came as many people were returning from the holiday weekend.",
    "Reporters were not allowed to ask questions after the statement.",
    "Some residents said they had heard about the news on social media first.",
    "It was not immediately clear how long the situation would last.",
]

SOURCES = [
    "according to people familiar with the matter",
    "a spokesperson said",
    "according to a statement released on {weekday}",
    "local media reported",
]
