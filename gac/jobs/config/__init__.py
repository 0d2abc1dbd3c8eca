"""What a job is (:mod:`.spec`) and how a config becomes one, checked once (:mod:`.build`, typed by :mod:`.schema`; :mod:`.compose`, :mod:`.command_line`, the axes table :mod:`.axes`)."""
